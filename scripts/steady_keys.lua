-- wrk script: every request carries an `x-key` drawn at random from 50,000 keys, so that the
-- same share of the keys is active at any time, and each connection waits 2 ms between its
-- requests, so that the traffic is steady (a few thousand requests a second) rather than as
-- fast as the machine goes: the steady traffic of `scripts/long_run.sh`.
local keys = 50000

function init(args)
  math.randomseed(os.time())
end

function delay()
  return 2
end

function request()
  return wrk.format("GET", "/", { ["x-key"] = "k" .. math.random(keys) })
end

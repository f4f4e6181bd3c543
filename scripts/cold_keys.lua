-- wrk script: every request carries a new `x-key`, so each key is seen once: the cold keys
-- of `scripts/bench.sh`. The keys start with the time and the thread's number, so that no two
-- runs share one.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", os.time() .. "-" .. threads)
end

local counter = 0

function request()
  counter = counter + 1
  return wrk.format("GET", "/", { ["x-key"] = id .. "-" .. counter })
end

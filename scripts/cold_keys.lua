-- wrk script: every request carries a new `x-key` (a counter per wrk thread, prefixed by the
-- thread's id), so each key is seen once: the cold keys of `scripts/bench.sh`.
local counter = 0
local prefix = ""

function setup(thread)
  thread:set("id", tostring(math.random(1, 1000000000)))
end

function init(args)
  prefix = (id or "0") .. "-"
end

function request()
  counter = counter + 1
  return wrk.format("GET", "/", { ["x-key"] = prefix .. counter })
end

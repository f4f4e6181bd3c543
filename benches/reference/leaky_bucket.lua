-- Minimal leaky bucket (as a meter), for comparison only (scripts/bench.sh,
-- scripts/redis_instructions.sh): TIME, GET of "level last", SET ... PX of the new state. ARGV:
-- capacity, units drained per µs. Replies as the crate's script does for one policy: {verdict
-- (-2 admitted, else the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local level = 0
local raw = redis.call('GET', KEYS[1])
if raw then
  local a, b = string.match(raw, '(%d+) (%d+)')
  level = math.max(0, tonumber(a) - (now - tonumber(b)) * rate)
end
if level + 1 > capacity then
  return {math.ceil((level + 1 - capacity) / rate), capacity - level, math.ceil(level / rate)}
end
level = level + 1
local ttl = math.ceil(level / rate / 1000)
redis.call('SET', KEYS[1], string.format('%d %d', level, now), 'PX', string.format('%d', math.max(ttl, 1)))
return {-2, capacity - level, math.ceil(level / rate)}

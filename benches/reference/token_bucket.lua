-- Minimal token bucket, for comparison only (scripts/bench.sh, scripts/redis_instructions.sh):
-- TIME, GET of "tokens last", SET ... PX of the new state. ARGV: capacity, tokens added per µs
-- (a whole number here). Replies as the crate's script does for one policy: {verdict (-2
-- admitted, else the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens = capacity
local raw = redis.call('GET', KEYS[1])
if raw then
  local a, b = string.match(raw, '(%d+) (%d+)')
  tokens = math.min(capacity, tonumber(a) + (now - tonumber(b)) * rate)
end
if tokens < 1 then
  return {math.ceil((1 - tokens) / rate), 0, math.ceil((capacity - tokens) / rate)}
end
tokens = tokens - 1
local ttl = math.ceil((capacity - tokens) / rate / 1000)
redis.call('SET', KEYS[1], string.format('%d %d', tokens, now), 'PX', string.format('%d', math.max(ttl, 1)))
return {-2, tokens, math.ceil((capacity - tokens) / rate)}

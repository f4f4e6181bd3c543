-- Minimal sliding log, for comparison only (scripts/bench.sh): TIME, ZREMRANGEBYSCORE of what
-- left the window, ZCARD, ZADD, PEXPIRE. ARGV: limit, window in µs.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], string.format('%d', now), t[1] .. t[2] .. ':' .. math.random(1000000))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(window / 1000)))
return 1

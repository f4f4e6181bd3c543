-- Minimal sliding log, for comparison only (scripts/bench.sh, scripts/redis_instructions.sh):
-- TIME, ZREMRANGEBYSCORE of what left the window, ZCARD, ZADD, PEXPIRE. ARGV: limit, window in
-- µs. Replies as the crate's script does for one policy: {verdict (-2 admitted, else the
-- retry-after in µs), remaining, reset after in µs}; a denial's retry-after is the oldest
-- entry's time out of the window (ZRANGE of it).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local retry = tonumber(oldest[2]) + window - now
  return {retry, 0, window}
end
redis.call('ZADD', KEYS[1], string.format('%d', now), t[1] .. t[2] .. ':' .. math.random(1000000))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(window / 1000)))
return {-2, limit - count - 1, window}

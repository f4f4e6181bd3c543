-- Two minimal sliding logs on one request, for comparison only (scripts/redis_instructions.sh):
-- TIME once; for each log (KEYS[i]), ZREMRANGEBYSCORE of what left its window and ZCARD; both
-- decided before either is charged; ZADD and PEXPIRE of each only when both admit. ARGV: each
-- log's limit and window in µs. Replies as the crate's script does for two policies: per
-- policy, {verdict (-2 admitted, else the retry-after in µs: the oldest entry's time out of the
-- window, ZRANGE of it), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local counts, ok = {}, true
for i = 1, 2 do
  local window = tonumber(ARGV[2 * i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - window))
  counts[i] = redis.call('ZCARD', KEYS[i])
  ok = ok and counts[i] < tonumber(ARGV[2 * i - 1])
end
local reply = {}
local member = t[1] .. t[2] .. ':' .. math.random(1000000)
for i = 1, 2 do
  local limit, window = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local at = 3 * i - 2
  if counts[i] >= limit then
    local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    reply[at], reply[at + 1], reply[at + 2] = tonumber(oldest[2]) + window - now, 0, window
  elseif ok then
    redis.call('ZADD', KEYS[i], string.format('%d', now), member)
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil(window / 1000)))
    reply[at], reply[at + 1], reply[at + 2] = -2, limit - counts[i] - 1, window
  else
    reply[at], reply[at + 1], reply[at + 2] = -2, limit - counts[i], window
  end
end
return reply

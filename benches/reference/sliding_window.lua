-- Minimal sliding window counter with sub-window buckets, for comparison only
-- (scripts/bench.sh, scripts/redis_instructions.sh): TIME, HGETALL of the bucket counters,
-- HINCRBY of the current one, PEXPIRE, and HDEL of buckets that left the window, when there are
-- any. ARGV: limit, number of buckets, bucket length in µs. Replies as the crate's script does
-- for one policy: {verdict (-2 admitted, else the retry-after in µs), remaining, reset after in
-- µs}; a denial's retry-after is the current bucket's end (an upper bound, kept minimal).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, n, len = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local current = math.floor(now / len)
local into = now - current * len
local counts = redis.call('HGETALL', KEYS[1])
local used, stale = 0, {}
for i = 1, #counts, 2 do
  local index, count = tonumber(counts[i]), tonumber(counts[i + 1])
  if index > current - n then
    used = used + count
  elseif index == current - n then
    used = used + math.ceil(count * (len - into) / len)
  else
    stale[#stale + 1] = counts[i]
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
local reset = n * len + len - into
if used + 1 > limit then
  return {len - into, limit - math.min(used, limit), reset}
end
redis.call('HINCRBY', KEYS[1], string.format('%d', current), 1)
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((n + 1) * len / 1000)))
return {-2, limit - used - 1, reset}

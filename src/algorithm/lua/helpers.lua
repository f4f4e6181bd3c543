-- tower-ratelimit: shared helpers. Every number is an integer below 2^53, so doubles are exact;
-- divisions go through fdiv/cdiv, which correct the rounding of a / b.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local function int(n)
  return string.format('%.0f', n)
end

-- Space-separated integers, or nil when the value is missing or not ours.
local function parse(raw, count)
  if not raw then
    return nil
  end
  local t = {}
  for word in string.gmatch(raw, '%S+') do
    local n = tonumber(word)
    if not n then
      return nil
    end
    t[#t + 1] = n
  end
  if count and #t ~= count then
    return nil
  end
  return t
end

-- Writes a string state with a TTL (milliseconds, rounded up, at least 1) until expires_at.
local TTL_SLACK = 0

local function store(key, value, now, expires_at)
  local ttl = cdiv(expires_at - now, 1000) + TTL_SLACK
  if ttl < 1 then
    ttl = 1
  end
  redis.call('SET', key, value, 'PX', ttl)
end

local function get(key)
  local raw = redis.call('GET', key)
  if raw == false then
    return nil
  end
  return raw
end

-- The token and leaky buckets keep "amount last": the time of their last update, which is
-- never moved back, and how far it is ahead of `now` when the clock went back.
local function last_after(st, now)
  if st and st[2] > now then
    return st[2]
  end
  return now
end

local function bucket_lag(p, st, now)
  return last_after(st, now) - now
end


-- tower-ratelimit: shared helpers. Every number is an integer below 2^53, so doubles are exact;
-- divisions go through fdiv/cdiv, which correct the rounding of a / b. The library functions
-- used on every decision, and `redis.call` (as `call`), are upvalues set by the first decision
-- (a Redis function's library cannot reach `string` while it loads): no global lookups per
-- call. Calls cost: a Lua call is about 500 instructions of Redis's interpreter, a table about
-- 1,100 (callgrind), so the decision path makes few of either.
local format, find, sub, match, byte, call
-- How an integer is formatted: '%d' where Lua's integer format is 64 bits wide (as on every
-- 64-bit Redis), which costs a fifth of '%.0f' (glibc formats doubles slowly); '%.0f' elsewhere.
-- INT2 formats two.
local INT, INT2 = '%.0f', '%.0f %.0f'

local function bind_libraries()
  format, find, sub, match, byte = string.format, string.find, string.sub, string.match, string.byte
  call = redis.call
  if format('%d', 2 ^ 53) == '9007199254740992' then
    INT, INT2 = '%d', '%d %d'
  end
end

local function fdiv(a, b)
  -- The floor of a / b by `%` (an operator, not a call to math.floor).
  local r = a / b
  local q = r - r % 1
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  -- The ceiling of a / b, corrected as fdiv corrects the floor (not by calling it: a Lua call
  -- costs more than these lines).
  local r = a / b
  local q = r - r % 1
  if q * b < a then
    q = q + 1
  end
  if (q - 1) * b >= a then
    q = q - 1
  end
  return q
end

local function int(n)
  return format(INT, n)
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

-- Milliseconds added to every TTL; set by each decision (0 unless the time is injected).
local TTL_SLACK = 0
-- The end of the block on record for the key that `store` writes, kept in its value (set
-- around each write of a key that has one).
local KEEP_BLOCK = nil

-- The string states keep a block in the same value, after a bar: "state|end". A key that
-- was never blocked has no bar, so a decision reads its block with the GET it makes anyway.
-- `raw` (a GET's reply) split into the state part (nil when the key is missing) and the
-- block's end, if any; the parsers below try the whole value first, so a key without a block
-- is read without this.
local function split_block(raw)
  if not raw then
    return nil
  end
  local bar = find(raw, '|', 1, true)
  if not bar then
    return raw
  end
  return sub(raw, 1, bar - 1), tonumber(sub(raw, bar + 1))
end

-- A string state is written with the tag of the parameters it was written under:
-- "state~tag", or "state~tag|end" when blocked. The tag ("~id:p1,p2,...", the algorithm's id
-- and its parameters in base 36, with its tilde) is sent with each policy (`p.tag`, made by `Tier` in
-- Rust). A decision that finds another tag (the policy was reloaded with another quota, or
-- another instance still runs the old one) converts the state to its own parameters first
-- (`adopt` in decide.lua); a state without a tag is taken as written under the present
-- parameters.
-- `raw` split into the state part, its tag (nil when none) and the block's end (nil when none).
local function split_state(raw)
  local state, ends = split_block(raw)
  if not state then
    return nil
  end
  local tilde = find(state, '~', 1, true)
  if not tilde then
    return state, nil, ends
  end
  return sub(state, 1, tilde - 1), sub(state, tilde), ends
end

-- A one-integer state ("tat"), as a number, the block's end, if any, and the state's tag when
-- it is not the present one (`p.tag`).
local function read1(key, p)
  local raw = call('GET', key)
  if not raw then
    return nil
  end
  local tag = p.tag
  -- Whether `raw` ends with the tag (no block after it): a plain search from where the tag
  -- would start, which builds no string (written here, not called: a Lua call costs more).
  if find(raw, tag, #raw - #tag + 1, true) then
    local n = tonumber(sub(raw, 1, #raw - #tag))
    if n then
      return n
    end
  end
  local state, ends
  state, tag, ends = split_state(raw)
  if tag == p.tag then
    tag = nil
  end
  return tonumber(state), ends, tag
end

-- A two-integer state ("start count", "tokens last") in the table `into` (one per policy
-- position, reused from call to call: no table built per decision), the block's end, if any,
-- and the state's tag when it is not the present one; nil for the state when the key is
-- missing.
local function read2(key, p, _, into)
  local raw = call('GET', key)
  if not raw then
    return nil
  end
  local a, b, tag, ends
  local t = p.tag
  if find(raw, t, #raw - #t + 1, true) then
    a, b = match(raw, '^(%d+) (%d+)~')
  end
  if not a then
    local state
    state, tag, ends = split_state(raw)
    if tag == p.tag then
      tag = nil
    end
    a, b = match(state or '', '^(%d+) (%d+)$')
    if not a then
      return nil, ends, tag
    end
  end
  into[1], into[2] = tonumber(a), tonumber(b)
  return into, ends, tag
end

-- `amount`, counted in `from` per unit, counted in `to` per unit instead (twin of `rescale` in
-- Rust): whole units exactly, the part of a unit in double arithmetic (the same operations as
-- Rust's f64), rounded up; below 2^53.
local function rescale(amount, from, to)
  local most = fdiv(9007199254740992, to) - 1
  local whole = fdiv(amount, from)
  if whole >= most then
    return most * to
  end
  local part = amount - whole * from
  local r = whole * to
  if part > 0 then
    r = r + math.ceil(part / from * to)
  end
  return r
end

-- Milliseconds from `now` to `expires_at`, rounded up (TTLs are far below 2^43 µs, where
-- the division by 1000 is exact enough for `%`), plus the slack; at least 1.
local function ttl_ms(now, expires_at)
  local us = expires_at - now
  local ms = us / 1000
  ms = ms - ms % 1
  if ms * 1000 < us then
    ms = ms + 1
  end
  ms = ms + TTL_SLACK
  if ms < 1 then
    return 1
  end
  return ms
end

-- When a key whose state expires at `expires_at` may expire, keeping the block on record.
local function until_block_ends(expires_at)
  if KEEP_BLOCK and KEEP_BLOCK > expires_at then
    return KEEP_BLOCK
  end
  return expires_at
end

-- The TTL of a key being blocked until `ends`: what it has left, or to the block's end.
local function ttl_to_block_end(key, now, ends)
  local ttl = ttl_ms(now, ends)
  local left = call('PTTL', key)
  if left > ttl then
    return left
  end
  return ttl
end

-- Writes a string state, tagged with the parameters `p` it was written under, with a TTL
-- (milliseconds, rounded up, at least 1) until expires_at, keeping the block on record beside
-- it.
local function store(key, p, value, now, expires_at)
  value = value .. p.tag
  if KEEP_BLOCK then
    value = value .. '|' .. int(KEEP_BLOCK)
    expires_at = until_block_ends(expires_at)
  end
  -- The TTL formatted here: Redis formats a number argument with '%.17g', at four times the cost.
  call('SET', key, value, 'PX', format(INT, ttl_ms(now, expires_at)))
end

-- Blocks a key with a string state until `ends`: its state stays as it is, and the key lives
-- at least until the block ends.
local function block_in_value(self, key, p, st, now, ends)
  local raw = split_block(call('GET', key)) or ''
  call('SET', key, raw .. '|' .. int(ends), 'PX', ttl_to_block_end(key, now, ends))
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

-- The buckets' `release` (twin of their `Step::release`): gives back the latest slot only,
-- the one the bucket was last updated at.
local function bucket_release(self, key, p, st, now, slot, units)
  if st and st[2] == slot then
    self:refund(key, p, st, now, units)
  end
end


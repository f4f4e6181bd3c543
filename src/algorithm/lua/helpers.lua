-- tower-ratelimit: shared helpers. Every number is an integer below 2^53, so doubles are exact;
-- divisions that must give an integer go through fdiv/cdiv. The library functions
-- used on every decision, and `redis.call` (as `call`), are upvalues set by the first decision
-- (a Redis function's library cannot reach `string` while it loads): no global lookups per
-- call. Calls cost: a Lua call is about 500 instructions of Redis's interpreter, a table about
-- 1,100 (callgrind), so the decision path makes few of either: a function marked `--@inline`
-- is written into the phases of a decision in place of its calls (see `luagen/`), so it
-- returns only from a line of its own, never from inside a loop.
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

-- Integer division by `%`, an operator, not a call to math.floor or math.ceil: for integers
-- below 2^53, a % b is exact (a / b, correctly rounded, never reaches the next integer: that
-- would take a remainder below |a| / 2^53), and so is the division of the multiple left.
--@inline
local function fdiv(a, b)
  -- The floor of a / b.
  return (a - a % b) / b
end

--@inline
local function cdiv(a, b)
  -- The ceiling of a / b.
  return (a + (-a) % b) / b
end

--@inline
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
-- "stateTAG", or "stateTAG|end" when blocked. The tag ("Cp1,p2,...": a capital letter for the
-- algorithm's id, A for 0, then its parameters, each in base 36 or, when shorter, in decimal
-- with its trailing zeros as an exponent, `864E8`) is sent with each policy (`p.tag`, made by
-- `Tier` in Rust). A state is digits, spaces and colons, so its tag starts at the value's
-- first letter. It is that short because the value is one allocation that grows by 16 bytes
-- past 28 characters. A decision that finds another tag (the policy was reloaded with
-- another quota, or another instance still runs the old one) converts the state to its own
-- parameters first (`adopt` in decide.lua); a state without a tag is taken as written under
-- the present parameters.
-- `raw` split into the state part, its tag (nil when none) and the block's end (nil when none).
local function split_state(raw)
  local state, ends = split_block(raw)
  if not state then
    return nil
  end
  local letter = find(state, '%a')
  if not letter then
    return state, nil, ends
  end
  return sub(state, 1, letter - 1), sub(state, letter), ends
end

-- `raw` without its tag when it ends with `tag` (no block after it: a state as it is usually
-- found, read without splitting it); nil otherwise. The tag is found by a plain search from
-- where it would start, which builds no string.
--@inline
local function untagged(raw, tag)
  if find(raw, tag, #raw - #tag + 1, true) then
    return sub(raw, 1, #raw - #tag)
  end
  return nil
end

-- A one-integer state ("tat"), as a number, the block's end, if any, and the state's tag when
-- it is not the present one (`p.tag`); nil for the state when the key is missing, false when
-- it holds no state this reads (as every twin's `load`: `uncharged` repairs a TTL only where
-- a key is).
--@inline
local function read1(key, p)
  local raw = call('GET', key)
  if not raw then
    return nil
  end
  local bare = untagged(raw, p.tag)
  if bare then
    local n = tonumber(bare)
    if n then
      return n
    end
  end
  local state, tag, ends = split_state(raw)
  if tag == p.tag then
    tag = nil
  end
  return tonumber(state) or false, ends, tag
end

-- A two-integer state ("start count", "tokens last") in the table `into` (one per policy
-- position, reused from call to call: no table built per decision), the block's end, if any,
-- and the state's tag when it is not the present one; nil for the state when the key is
-- missing, false when it holds none this reads.
--@inline
local function read2(key, p, _, into)
  local raw = call('GET', key)
  local st, ends, tag
  if raw then
    -- Written under these parameters, no block: one match (tags are interned strings, and
    -- compare as one pointer).
    local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
    if written ~= p.tag then
      a = nil
    end
    if not a then
      local state
      state, tag, ends = split_state(raw)
      if tag == p.tag then
        tag = nil
      end
      a, b = match(state or '', '^(%d+) (%d+)$')
    end
    st = false
    if a then
      -- Lua's arithmetic reads a numeral as tonumber would, without a call.
      into[1], into[2] = a + 0, b + 0
      st = into
    end
  end
  return st, ends, tag
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

-- Milliseconds from `since` to `expires_at`, rounded up; at least 1. A TTL counts from
-- `since`, the time the decision's `clock` gives for it: the present, less a slack when the
-- clock is injected (Redis expires keys on its own clock, which an injected one may lag).
--@inline
local function ttl_ms(since, expires_at)
  local ms = cdiv(expires_at - since, 1000)
  if ms < 1 then
    ms = 1
  end
  return ms
end

-- When a key whose state expires at `expires_at` may expire, keeping the block on record
-- until `keep` (nil: none).
--@inline
local function until_block_ends(expires_at, keep)
  local at = expires_at
  if keep and keep > at then
    at = keep
  end
  return at
end

-- The TTL of a key being blocked until `ends`: what it has left, or to the block's end.
local function ttl_to_block_end(key, since, ends)
  local ttl = ttl_ms(since, ends)
  local left = call('PTTL', key)
  if left > ttl then
    return left
  end
  return ttl
end

-- Writes a string state, `value`, tagged with the parameters `p` it was written under (its
-- tag is written by `format(p.f1, n)` or `format(p.f2, a, b)`: see `remember`), with a TTL
-- (milliseconds from `since`, rounded up, at least 1) until expires_at, keeping the block
-- on record beside it until `keep` (nil: none). Every writer of a state takes `keep` and
-- `since` last, and hands them on.
--@inline
local function store(key, p, value, expires_at, keep, since)
  if p.limit_end and p.limit_end > expires_at then
    -- A key's own limit lives until it ends.
    expires_at = p.limit_end
  end
  if keep then
    local block_end = int(keep)
    value = value .. '|' .. block_end
    expires_at = until_block_ends(expires_at, keep)
  end
  local ms = ttl_ms(since, expires_at)
  -- The TTL formatted here: Redis formats a number argument with '%.17g', at four times the cost.
  call('SET', key, value, 'PX', format(INT, ms))
end

-- Blocks a key with a string state until `ends`: its state stays as it is, and the key lives
-- at least until the block ends.
local function block_in_value(self, key, p, st, now, ends, _, since)
  local raw = split_block(call('GET', key)) or ''
  call('SET', key, raw .. '|' .. int(ends), 'PX', ttl_to_block_end(key, since, ends))
end

-- The token and leaky buckets keep "amount last": the time of their last update, which is
-- never moved back, and how far it is ahead of `now` when the clock went back.
--@inline
local function last_after(st, now)
  if st and st[2] > now then
    return st[2]
  end
  return now
end

--@inline
local function bucket_lag(p, st, now)
  local last = last_after(st, now)
  return last - now
end

-- The buckets' `release` (twin of their `Kernel::release`): gives back the latest booked time only,
-- the one the bucket was last updated at.
local function bucket_release(self, key, p, st, now, at, units, keep, since)
  if st and st[2] == at then
    self:refund(key, p, st, now, units, keep, since)
  end
end


-- Tables reused from call to call (a table costs Redis about 1,100 instructions to build and
-- collect): per policy position, a table to load its state in and one for the state as strict
-- as a lease makes it (the first position's made here, the others by the first decision of
-- that many policies); the reply. A call runs alone, and Redis has read the reply before the
-- next one.
local STATES, LEASED = { {} }, { {} }
local REPLY = {}
-- Each policy of a call as `decide` reads it, per position: its algorithm, operation,
-- parameters (then those it was decided under), cost and the operation's integers.
local ALGS, OPS, PS, COSTS, XS, YS = {}, {}, {}, {}, {}, {}

-- Numbers read from the strings a call sends, remembered: `tonumber` reads a string with
-- strtod, about 1,800 instructions, where a table lookup costs a tenth of that. What is
-- remembered is what the policies send, a bounded set: the shapes, and each tag's parameters
-- (a tag is the algorithm and its parameters: they are sent as the tag only). Kept from call
-- to call when the decision runs as a function; a script starts afresh each call.
local SHAPES, TAGGED, TAGS = {}, {}, 0

-- The shape sent as `s`, a number; nil when it is not one.
local function read_shape(s)
  local shape = tonumber(s)
  if shape and shape >= 0 and shape < 2 * CLOCK_FLAG then
    SHAPES[s] = shape
  end
  return shape
end

-- The parameters a tag names (see `split_state`) in `into` (from its first place), and the
-- algorithm's letter; nil when `tag` is not one.
local function tag_params(tag, into)
  local id, rest = match(tag, '^(%u)(.*)$')
  if not id then
    return nil
  end
  if find(rest, '@', 1, true) then
    -- A key's own limit's quota follows its parameters (see `own_params`).
    rest = string.gsub(rest, '@[^;]*', '')
  end
  local k = 0
  for word in string.gmatch(rest, '[^,;]+') do
    k = k + 1
    if find(word, 'E', 1, true) then
      into[k] = tonumber(word)
    else
      into[k] = tonumber(word, 36)
    end
    if not into[k] then
      return nil
    end
  end
  return id
end

-- Keeps the parameters `p` of `tag` for the next call with it (at most 1,000 tags: then
-- forgotten all at once), with the formats of a state of one and two integers tagged with
-- them: one `format` builds the value `store` writes (a tag has no '%').
local function remember(tag, p)
  p.f1, p.f2 = INT .. p.tag, INT2 .. p.tag
  if TAGS >= 1000 then
    TAGGED, TAGS = {}, 0
  end
  TAGGED[tag] = p
  TAGS = TAGS + 1
end

-- The parameters of the policy sent with `tag`: a table { p1, p2, ..., tag = tag }, the same
-- one for every call with that tag (never written to); nil when the tag is not one.
--@inline
local function read_params(tag)
  local p = TAGGED[tag]
  if not p and tag then
    -- An escalation follows the rest after '!' (`Escalation::lua_suffix`), and a calendar's
    -- boundaries follow the tag after ';': parameters, not part of the tag.
    local bang = find(tag, '!', 1, true)
    local rest = bang and sub(tag, 1, bang - 1) or tag
    local semi = find(rest, ';', 1, true)
    p = { tag = semi and sub(rest, 1, semi - 1) or rest }
    local escalate = bang and {}
    if not tag_params(rest, p) or (bang and not tag_params('Q' .. sub(tag, bang + 1), escalate)) then
      p = nil
    else
      p.escalate = escalate
      remember(tag, p)
    end
  end
  return p
end

-- The parameters of a key's own limit, from the tag its state is written under:
-- "<parameters>@<end>,<limit>,<window>,<burst>" (`RateLimitLayer::set_limit`): a table
-- { p1, p2, ..., tag = stale, limit_end = end, quota = { limit, window, burst } }, the same
-- one for every call with that tag; a calendar's boundaries are the call's (`p`'s: a key's
-- own limit keeps its policy's period). Nil when it is not one.
local function own_params(stale, p)
  local o = TAGGED[stale]
  if not o then
    local at = find(stale, '@', 1, true)
    if not at then
      return nil
    end
    o = { tag = stale }
    local numbers = {}
    if not tag_params(stale, o) or not tag_params('Q' .. sub(stale, at + 1), numbers) then
      return nil
    end
    o.limit_end, o.quota = numbers[1], { numbers[2], numbers[3], numbers[4] }
    remember(stale, o)
  end
  if o[2] == 0 and p[2] == 0 then
    o[4], o[5], o[6], o[7] = p[4], p[5], p[6], p[7]
  end
  return o
end

-- The time, and the time TTLs count from (`ttl_ms`): the injected time at the end of the
-- arguments, less the TTL slack after it, else Redis TIME, twice.
--@inline
local function clock(args, injected)
  local now, since
  if injected then
    now = tonumber(args[#args - 1])
    since = now - 1000 * tonumber(args[#args])
  else
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
    since = now
  end
  return now, since
end

-- The clock-lag adjustment (twin of `evaluate_with_lag`), for the algorithms that keep their own
-- time (`alg.lag`, which gives `lag`): a state newer than `now` (the clock went back, or a
-- request booked a later time) decides as of its own time, its times moved to be from `now`,
-- and admits no cost before then. Called only for those algorithms, so the others pay nothing
-- for it.
--@inline
local function shift(late, cost, ok, remaining, reset, retry)
  if late > 0 then
    remaining = 0
    -- Not a fresh key before its own time, even with nothing counted there.
    reset = reset + late
    if retry >= 0 then
      retry = retry + late
    end
    if ok == 1 and cost > 0 then
      ok, retry = 0, late
      if reset < late then
        reset = late
      end
    end
  end
  return ok, remaining, reset, retry
end

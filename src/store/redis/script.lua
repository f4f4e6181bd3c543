-- tower-ratelimit: its decision script. Generated (luagen/) from
-- src/algorithm/lua/*.lua and src/store/redis/{act,grant,phases,decide}.lua, with
-- the numbers Rust gives their names: do not edit it, edit them and run
-- `UPDATE_LUA=1 cargo test --lib script`.
local ALG = {}
local DECIDES = { true, false, true, true, true, true, false, false, false, false, false, false, false, false, false, true }
local CHARGES = { 2, 1, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2 }
local ACTS = { false, false, false, false, false, false, true, true, true, true, true, true, true, true, true, false }
local RELIMITS = { false, false, false, false, false, false, false, false, false, false, false, false, false, true, true, false }
local ARGS = { 0, 0, 0, 0, 1, 2, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1 }
local GRANTS = { false, false, false, true, true, true, false, false, false, false, false, false, false, false, false, false }
local WIDTH = { 3, 3, 3, 6, 6, 6, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3 }
local KEEPS = { false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, true }
local FUSES = { true, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false }
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
  if shape and shape >= 0 and shape < 2 * 2048 then
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
-- What acts on a key's state on its own, before a decision judges it: the operations' `ACT`
-- arms (`act`), and the conversion of a state written under other parameters (`adopt`: a
-- reload, another instance's version, a key's own limit begun or ended). Written into the
-- script before `decide.lua`, which calls `act` and `adopt`.

-- Old parameters read from a tag, reused from call to call.
local OLD = {}

-- Puts the key's state `st`, written under `from` (nil: under nothing this policy reads),
-- under `to`: a key's own limit's parameters or the policy's, converted as a reload converts
-- it (twin of `Row::put_under` in Rust). With nothing used, only the key's own limit is kept
-- (and the block on record). The sliding log, whose entries mean the same under any quota,
-- marks its own limit itself. The block on record until `keep` (nil: none) is kept; TTLs
-- count from `since`.
local function put_under(alg, key, st, now, from, to, keep, since)
  if alg.mark then
    alg:mark(key, to, now, keep, since)
    return
  end
  if st and from and alg.convert and alg:convert(key, from, to, st, now, keep, since) then
    return
  end
  local value, e = '', now
  if to.limit_end then
    value, e = to.tag, to.limit_end
  end
  if keep then
    value = value .. '|' .. int(keep)
    if keep > e then
      e = keep
    end
  end
  if value == '' then
    call('DEL', key)
  else
    call('SET', key, value, 'PX', format(INT, ttl_ms(since, e)))
  end
end

-- The parameters a state of tag `stale` was written under (nil: the present ones, `p`);
-- nil for a state of another algorithm.
local function written_under(stale, p)
  if not stale then
    return p
  end
  if find(stale, '@', 1, true) then
    return own_params(stale, p)
  end
  if tag_params(stale, OLD) == sub(p.tag, 1, 1) then
    return OLD
  end
  return nil
end

-- A state found written under other parameters (`stale`, its tag: the policy was reloaded, or
-- another instance runs another version of it), converted to the present ones and written
-- back (twin of `Compiled::convert`): the state and the block's end then. A state of another
-- algorithm, or one left with nothing used, is forgotten; the key keeps its block.
local function adopt(alg, key, p, st, ends, now, stale, into, since)
  if find(stale, '@', 1, true) then
    local o = own_params(stale, p)
    if o and o.limit_end > now and (not alg.keeps or alg.keeps(o, p)) then
      -- The key's own limit: decided under it.
      return st, ends, o
    end
    -- Its own limit has ended (or counts periods the policy no longer counts): back under
    -- the policy's quota, its usage kept.
    put_under(alg, key, o and st, now, o, p, ends, since)
    local kept, block = alg.load(key, p, now, into)
    return kept, block, p
  end
  if st and alg.convert and tag_params(stale, OLD) == sub(p.tag, 1, 1) then
    local kept = alg:convert(key, OLD, p, st, now, ends, since)
    if kept then
      local state, block = alg.load(key, p, now, into)
      return state, block, p
    end
  end
  if ends then
    call('SET', key, '|' .. int(ends), 'KEEPTTL')
  else
    call('DEL', key)
  end
  return nil, ends, p
end


-- The arms of the operations that act on their own (twin of `act` in the memory store), each
-- called with the policy's algorithm, key, parameters, state, the time, the units and the
-- operation's integer, then the block on record (`keep`), which every write they make keeps,
-- and the time TTLs count from.
local ACT = {}
ACT[7] = function(alg, key, p, st, now, units, _, keep, since)
  alg:refund(key, p, st, now, units, keep, since)
end
ACT[8] = function(_, key)
  -- The key's state, and its strikes' record, if it blocks on violation (see `strike`).
  call('DEL', key, key .. '!')
end
ACT[9] = function(alg, key, p, st, now, units, _, keep, since)
  if units > 0 then
    alg:commit(key, p, st, now, units, keep, since)
  end
end
ACT[10] = function(alg, key, p, st, now, _, us, keep, since)
  alg:block(key, p, st, now, now + us, keep, since)
end
-- The algorithm's own give-back, else a refund until the lease's end: see `Kernel::give_back`.
ACT[11] = function(alg, key, p, st, now, units, lease_end, keep, since)
  if alg.give_back then
    alg:give_back(key, p, st, now, lease_end, units, keep, since)
  elseif now <= lease_end then
    alg:refund(key, p, st, now, units, keep, since)
  end
end
-- The algorithm's own release, else its give-back: see `Kernel::release`.
ACT[12] = function(alg, key, p, st, now, units, at, keep, since)
  if alg.release then
    alg:release(key, p, st, now, at, units, keep, since)
  elseif alg.give_back then
    alg:give_back(key, p, st, now, at, units, keep, since)
  end
end

-- The difference between a request's real cost and its estimate, given back or owed (the
-- algorithm's own debit, else a charge: see `Kernel::debit`).
ACT[13] = function(alg, key, p, st, now, units, estimate, keep, since)
  if units < estimate then
    alg:refund(key, p, st, now, estimate - units, keep, since)
  elseif units > estimate then
    local debit = alg.debit or alg.commit
    debit(alg, key, p, st, now, units - estimate, keep, since)
  end
end

-- A key's own limit, `p` (its parameters, then '@' and its quota), until `limit_end` (0: the
-- longest window's time from now): the state converted from what it was written under.
ACT[14] = function(alg, key, p, st, now, from, limit_end, keep, since)
  if limit_end == 0 then
    limit_end = now + 31622400000000
  end
  local at = find(p.tag, '@', 1, true)
  local tag = sub(p.tag, 1, at) .. int(limit_end) .. 'E0,' .. sub(p.tag, at + 1)
  put_under(alg, key, st, now, from, own_params(tag, p), keep, since)
end
-- Back under the policy's own quota (`p`), from a key's own limit.
ACT[15] = function(alg, key, p, st, now, from, _, keep, since)
  if from ~= p then
    put_under(alg, key, st, now, from, p, keep, since)
  end
end

-- Runs the act of `op` on the key (its state loaded in `into`, converted first when it was
-- written under other parameters, or decided under the key's own limit); a key's own limit
-- set or ended is given what the state was written under instead of the units.
local function act(alg, op, key, p, now, units, x, into, since)
  local st, ends, stale = alg.load(key, p, now, into)
  if RELIMITS[op] then
    ACT[op](alg, key, p, st, now, written_under(stale, p), x, ends, since)
    return
  end
  if stale then
    st, ends, p = adopt(alg, key, p, st, ends, now, stale, into, since)
  end
  ACT[op](alg, key, p, st, now, units, x, ends, since)
end
-- The phases of a policy whose operation is not ENFORCE (phases.lua takes those here once its
-- state is read): a look, a shadow, an act's look at cost 0, and what the granting
-- operations do beyond a verdict: the time a WAIT books, the units a LEASE takes, the
-- slots CONCURRENCY holds.

-- A table to load a state in, for a moment.
local SCRATCH = {}

-- For a WAIT policy denied now with `verdict`: the wait until the time that admits it, when
-- it is a retry-after of at most `max_wait` (a block's end included: a paused key's calls
-- wait for it) and the cost is not 0 (a look books nothing) (twin of `booking` in Rust);
-- else nil.
local function booking(alg, p, st, ends, now, cost, key, verdict, max_wait)
  if cost == 0 or verdict < 0 or verdict > max_wait then
    return nil
  end
  if alg:verdict(p, st, ends, now + verdict, cost, key) == -2 then
    return verdict
  end
  return nil
end

-- Phase two for a WAIT policy admitted at the time `wait` microseconds away, whose reply
-- follows REPLY[at]: charges it there (the key's TTL still counted from `since`), then
-- reports the state as it is seen now, with the units, the time and the wait after the
-- verdict.
local function book(alg, key, p, st, ends, now, cost, wait, at, since)
  local at_time = now + wait
  if alg.book_commit then
    alg:book_commit(key, p, st, now, at_time, cost, ends, since)
  else
    alg:commit(key, p, st, at_time, cost, ends, since)
  end
  -- Admitted, the state reported as it is seen now (a look may deny: the sliding log still
  -- counts, now, entries that are gone at that time; a paused key has nothing left now).
  local seen = alg.load(key, p, now, SCRATCH)
  local _, remaining, reset = alg:verdict(p, seen, ends, now, 0, key)
  REPLY[at + 1], REPLY[at + 2] = -2, remaining
  REPLY[at + 3] = reset
  REPLY[at + 4], REPLY[at + 5], REPLY[at + 6] = cost, at_time, wait
end

-- Phase two for an admitted LEASE of up to `want` units ending at `lease_end`, whose reply
-- follows REPLY[at]: leases what is left, at least the cost and at most the units wanted,
-- and reports the verdict with the lease counted as spent (twin of `take_lease` in Rust).
local function take_lease(alg, key, p, st, ends, now, cost, want, lease_end, at, since)
  local _, left = alg:evaluate(p, st, now, 0, key)
  local units = left
  if units > want then
    units = want
  end
  if units < cost then
    units = cost
  end
  local verdict, remaining, reset = alg:verdict(p, st, ends, now, units, key)
  if verdict ~= -2 and units > cost then
    units = cost
    verdict, remaining, reset = alg:verdict(p, st, ends, now, units, key)
  end
  if units > 0 then
    if alg.lease_commit then
      alg:lease_commit(key, p, st, now, lease_end, units, ends, since)
    else
      alg:commit(key, p, st, now, units, ends, since)
    end
  end
  REPLY[at + 1], REPLY[at + 2], REPLY[at + 3] = verdict, remaining, reset
  REPLY[at + 4], REPLY[at + 5], REPLY[at + 6] = units, lease_end, lease_end - now
end

-- Phase two for a policy not charged, whose reply follows REPLY[base]: the state reported
-- as it stays when the policy admitted the request, its key given a TTL (from `since`) if
-- it lost its own. A key the load found nothing under (`st` nil: a state that is there but
-- unreadable is false; no block `ends`) has no TTL to lose, and costs no PTTL.
local function uncharged(alg, key, p, st, ends, now, since, cost, base)
  if REPLY[base + 1] == -2 and cost > 0 then
    local _, remaining, reset = alg:verdict(p, st, nil, now, 0, key)
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
  end
  if (st ~= nil or ends) and call('PTTL', key) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    call('PEXPIRE', key, ttl_ms(since, now + REPLY[base + 3]))
  end
end

-- Phase one for the policy at position i of operation `op` (not ENFORCE), its state `st` and
-- block `ends` read: decided on the state as strict as a lease could make it, in LEASED[i],
-- for a LEASE whose longest life is `x` (twin of `lease_verdict` in Rust), as if `x` more
-- units were asked for when it KEEPS them (`Op::judged`), its verdict in the reply,
-- and for a WAIT denied now, the wait of at most `x` until the time that would admit it.
-- Returns whether it admits the request, the state decided on, and for phase two the end of
-- the lease taken and the wait booked (nil when none).
local function phase_one_of(alg, i, op, key, p, now, cost, x, base, st, ends)
  local lease_end, wait
  local judged = cost
  if KEEPS[op] then
    judged = cost + x
  end
  if op == 6 then
    lease_end = now + x
    if alg.lease_end then
      lease_end = alg:lease_end(p, st, now, x)
    end
    if alg.lease_state then
      st = alg:lease_state(p, st, now, lease_end, LEASED[i])
    end
  end
  local v, remaining, reset = alg:verdict(p, st, ends, now, judged, key)
  REPLY[base + 1], REPLY[base + 2], REPLY[base + 3] = v, remaining, reset
  if GRANTS[op] then
    REPLY[base + 4], REPLY[base + 5], REPLY[base + 6] = 0, 0, 0
  end
  if v ~= -2 and op == 5 then
    wait = booking(alg, p, st, ends, now, cost, key, v, x)
  end
  return v == -2 or wait ~= nil, st, lease_end, wait
end

-- Whether a policy of operation `op` (not ENFORCE), the request admitted, is charged its
-- cost: always, or when its own verdict (in the reply that follows REPLY[base]) admits.
local function charged(op, base)
  local charges = CHARGES[op]
  return charges == 2 or (charges == 1 and REPLY[base + 1] == -2)
end

-- After the checks' replies (`total` integers), each key decided under its own limit: its
-- place and its quota's limit, window and burst (`OWN_WIDTH` integers; see `own_quota` in
-- Rust); then the reply's end.
local function own_limits(n, total)
  for i = 1, n do
    local o = PS[i]
    if o.limit_end then
      local q = o.quota
      REPLY[total + 1], REPLY[total + 2] = i, q[1]
      REPLY[total + 3], REPLY[total + 4] = q[2], q[3]
      total = total + 4
    end
  end
  REPLY[total + 1] = nil
  return total
end

-- The block of `level` as `e` says, and the level it stops at: the first whose block is
-- the longest (twin of `Escalation::top_level`), at most some 40 turns, a factor of 1 none.
local function level_block(e, level)
  local d, top = e[3], 1
  while top < level and d < e[4] and e[6] > 1 do
    d, top = d * e[6], top + 1
  end
  if d > e[4] then
    d = e[4]
  end
  return d, top
end

-- The strike of the policy at place i, which blocks on violation as `e` says (its denials,
-- their span, the first block, the longest, how long a level is remembered, the factor; see
-- `Escalation`), whose reply follows REPLY[base] (twin of `Shard::strike`). Denied by its
-- state (not NEVER: a cost above the capacity is no violation) and not within a block (the
-- end `ends` its phase one read: a denial under a block is none), the key's record
-- ("<key>!", in its hash slot: denials, the first's time, the last block's level, start and
-- end) counts one more denial in the span; the count
-- blocks the key, for the next level's time (the first once `forget` has passed since the
-- last block), and the reply tells the block: then the reply's end, `total`, gets its place,
-- negated, its level and its end (OWN_WIDTH integers). Returns the reply's end.
local function strike(alg, key, p, e, ends, now, since, base, i, total)
  local v = REPLY[base + 1]
  if v == -2 or v == -1 or (ends and ends > now) then
    return total
  end
  local record = key .. '!'
  local r = parse(call('GET', record), 5)
  local n, first, level, last, till = 0, now, 0, 0, 0
  if r then
    n, first, level, last, till = r[1], r[2], r[3], r[4], r[5]
  end
  if first + e[2] <= now then
    n, first = 0, now
  end
  n = n + 1
  if n >= e[1] then
    if last > 0 and last + e[5] > now then
      level = level + 1
    else
      level = 1
    end
    local d
    d, level = level_block(e, level)
    n, first, last, till = 0, now, now, now + d
    alg:block(key, p, nil, now, till, nil, since)
    -- The verdict as the block makes it (twin of `apply_block`).
    if v < d then
      REPLY[base + 1] = d
    end
    REPLY[base + 2] = 0
    if REPLY[base + 3] < d then
      REPLY[base + 3] = d
    end
    REPLY[total + 1], REPLY[total + 2] = -i, level
    REPLY[total + 3], REPLY[total + 4] = till, 0
    total = total + 4
  end
  local keep = first + e[2]
  if last + e[5] > keep then
    keep = last + e[5]
  end
  if till > keep then
    keep = till
  end
  call('SET', record, format(INT .. ' ' .. INT .. ' ' .. INT .. ' ' .. INT .. ' ' .. INT, n, first, level, last, till),
    'PX', format(INT, ttl_ms(since, keep)))
  REPLY[total + 1] = nil
  return total
end
-- Fixed window: twin of fixed_window.rs. Params: limit, window; for a calendar, limit, 0, the
-- calendar's id, then the boundaries the call carries (b0 .. b3: the periods before, holding
-- and after the caller's time). State: "start count".
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[1] = function()
  --@inline
  local load = read2

  -- The calendar period holding t, among the call's boundaries; past them, one more of the
  -- last one's length (only a clock a whole period away from the caller's gets there).
  local function period(p, t)
    if t < p[5] then
      return p[4], p[5]
    end
    if t < p[6] then
      return p[5], p[6]
    end
    if t < p[7] then
      return p[6], p[7]
    end
    return p[7], p[7] + p[7] - p[6]
  end

  -- The start and end of the window holding t (twin of `FixedWindow::bounds`).
  local function bounds(p, t)
    local w = p[2]
    if w > 0 then
      -- `fdiv`'s `%`, the multiple kept.
      local start = t - t % w
      return start, start + w
    end
    return period(p, t)
  end

  -- The running window's start, count and end; a state from a later window (a booked
  -- time, or the clock went back) is kept as the running one. The window holding `now` is
  -- `bounds`, written out for the usual window of the usual call.
  --@inline
  local function current(p, st, now)
    local w = p[2]
    local start, count, ends
    if w > 0 then
      start = now - now % w
      ends = start + w
    else
      start, ends = period(p, now)
    end
    count = 0
    if st and st[1] >= start then
      if st[1] > start then
        start, ends = bounds(p, st[1])
      end
      count = st[2]
    end
    return start, count, ends
  end

  -- A state from a later window (a booked time, or the clock went back) starts there.
  --@inline
  local function lag(p, st, now)
    local behind = 0
    if st and st[1] > now then
      behind = st[1] - now
    end
    return behind
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local limit = p[1]
    local start, count, ends = current(p, st, now)
    -- As of the state's own time when it is ahead (see `lag`).
    local from = now
    if start > from then
      from = start
    end
    local left = ends - from
    local remaining = limit - count
    if remaining < 0 then
      remaining = 0
    end
    -- The reset after `count` units: none when the window is empty.
    local ok = 0
    local reset = left
    local retry = -1
    if count + cost <= limit then
      ok = 1
      remaining = remaining - cost
      if count + cost == 0 then
        reset = 0
      end
    else
      if count == 0 then
        reset = 0
      end
      if cost <= limit then
        retry = left
      end
    end
    return ok, remaining, reset, retry, start, count, ends
  end

  -- Charged from the window phase one saw (`seen`: its start, count and end), else from the
  -- window holding `now`.
  --@inline
  local function commit(self, key, p, st, now, cost, keep, since, seen, count, stop)
    if seen then
      store(key, p, format(p.f2, seen, count + cost), stop, keep, since)
    else
      local start, n, till = current(p, st, now)
      store(key, p, format(p.f2, start, n + cost), till, keep, since)
    end
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    do -- evaluate
      local limit = p[1]
      do -- current
        local w = p[2]
        if w > 0 then
          seen1 = now - now % w
          seen3 = seen1 + w
        else
          seen1, seen3 = period(p, now)
        end
        seen2 = 0
        if st and st[1] >= seen1 then
          if st[1] > seen1 then
            seen1, seen3 = bounds(p, st[1])
          end
          seen2 = st[2]
        end
      end
      local from = now
      if seen1 > from then
        from = seen1
      end
      local left = seen3 - from
      remaining = limit - seen2
      if remaining < 0 then
        remaining = 0
      end
      ok = 0
      reset = left
      retry = -1
      if seen2 + cost <= limit then
        ok = 1
        remaining = remaining - cost
        if seen2 + cost == 0 then
          reset = 0
        end
      else
        if seen2 == 0 then
          reset = 0
        end
        if cost <= limit then
          retry = left
        end
      end
    end
    local behind
    do -- lag
      behind = 0
      if st and st[1] > now then
        behind = st[1] - now
      end
    end
    if behind > 0 then
      do -- shift
        local ok_4, remaining_4, reset_4, retry_4 = ok, remaining, reset, retry
        if behind > 0 then
          remaining_4 = 0
          reset_4 = reset_4 + behind
          if retry_4 >= 0 then
            retry_4 = retry_4 + behind
          end
          if ok_4 == 1 and cost > 0 then
            ok_4, retry_4 = 0, behind
            if reset_4 < behind then
              reset_4 = behind
            end
          end
        end
        ok, remaining, reset, retry = ok_4, remaining_4, reset_4, retry_4
      end
    end
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[i]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          do -- evaluate
            local limit = q[1]
            do -- current
              local w = q[2]
              seen1, seen2, seen3 = nil
              if w > 0 then
                seen1 = now - now % w
                seen3 = seen1 + w
              else
                seen1, seen3 = period(q, now)
              end
              seen2 = 0
              if st and st[1] >= seen1 then
                if st[1] > seen1 then
                  seen1, seen3 = bounds(q, st[1])
                end
                seen2 = st[2]
              end
            end
            local from = now
            if seen1 > from then
              from = seen1
            end
            local left = seen3 - from
            remaining = limit - seen2
            if remaining < 0 then
              remaining = 0
            end
            ok = 0
            reset = left
            retry = -1
            if seen2 + cost <= limit then
              ok = 1
              remaining = remaining - cost
              if seen2 + cost == 0 then
                reset = 0
              end
            else
              if seen2 == 0 then
                reset = 0
              end
              if cost <= limit then
                retry = left
              end
            end
          end
          local behind
          do -- lag
            behind = 0
            if st and st[1] > now then
              behind = st[1] - now
            end
          end
          if behind > 0 then
            do -- shift
              local ok_30, remaining_30, reset_30, retry_30 = ok, remaining, reset, retry
              if behind > 0 then
                remaining_30 = 0
                reset_30 = reset_30 + behind
                if retry_30 >= 0 then
                  retry_30 = retry_30 + behind
                end
                if ok_30 == 1 and cost > 0 then
                  ok_30, retry_30 = 0, behind
                  if reset_30 < behind then
                    reset_30 = behind
                  end
                end
              end
              ok, remaining, reset, retry = ok_30, remaining_30, reset_30, retry_30
            end
          end
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_31 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_31 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_31 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            if seen1 then
              repeat -- store
                local value, expires_at = format(q.f2, seen1, seen2 + cost), seen3
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_35 = expires_at
                    local at = expires_at_35
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            else
              local start, n, till
              do -- current
                local w = q[2]
                if w > 0 then
                  start = now - now % w
                  till = start + w
                else
                  start, till = period(q, now)
                end
                n = 0
                if st and st[1] >= start then
                  if st[1] > start then
                    start, till = bounds(q, st[1])
                  end
                  n = st[2]
                end
              end
              repeat -- store
                local value, expires_at = format(q.f2, start, n + cost), till
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_41 = expires_at
                    local at = expires_at_41
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            end
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_31 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_31) break
      end
      total = total_31 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[1]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        do -- evaluate
          local limit = q[1]
          do -- current
            local w = q[2]
            if w > 0 then
              seen1 = now - now % w
              seen3 = seen1 + w
            else
              seen1, seen3 = period(q, now)
            end
            seen2 = 0
            if st and st[1] >= seen1 then
              if st[1] > seen1 then
                seen1, seen3 = bounds(q, st[1])
              end
              seen2 = st[2]
            end
          end
          local from = now
          if seen1 > from then
            from = seen1
          end
          local left = seen3 - from
          remaining = limit - seen2
          if remaining < 0 then
            remaining = 0
          end
          ok = 0
          reset = left
          retry = -1
          if seen2 + cost <= limit then
            ok = 1
            remaining = remaining - cost
            if seen2 + cost == 0 then
              reset = 0
            end
          else
            if seen2 == 0 then
              reset = 0
            end
            if cost <= limit then
              retry = left
            end
          end
        end
        local behind
        do -- lag
          behind = 0
          if st and st[1] > now then
            behind = st[1] - now
          end
        end
        if behind > 0 then
          do -- shift
            local ok_53, remaining_53, reset_53, retry_53 = ok, remaining, reset, retry
            if behind > 0 then
              remaining_53 = 0
              reset_53 = reset_53 + behind
              if retry_53 >= 0 then
                retry_53 = retry_53 + behind
              end
              if ok_53 == 1 and cost > 0 then
                ok_53, retry_53 = 0, behind
                if reset_53 < behind then
                  reset_53 = behind
                end
              end
            end
            ok, remaining, reset, retry = ok_53, remaining_53, reset_53, retry_53
          end
        end
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            if seen1 then
              repeat -- store
                local value, expires_at = format(q.f2, seen1, seen2 + cost), seen3
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_58 = expires_at
                    local at = expires_at_58
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            else
              local start, n, till
              do -- current
                local w = q[2]
                if w > 0 then
                  start = now - now % w
                  till = start + w
                else
                  start, till = period(q, now)
                end
                n = 0
                if st and st[1] >= start then
                  if st[1] > start then
                    start, till = bounds(q, st[1])
                  end
                  n = st[2]
                end
              end
              repeat -- store
                local value, expires_at = format(q.f2, start, n + cost), till
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_64 = expires_at
                    local at = expires_at_64
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            end
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    block = block_in_value,
    load = load,
    bounds = bounds,
    current = current,
    lag = lag,
    evaluate = evaluate,
    -- Twin of `FixedWindow::convert`: the running window's count carried into the new window
    -- that holds the present (or the state's later window). A calendar's window ended when
    -- the present one's window holding the present starts after it.
    convert = function(self, key, q, p, st, now, keep, since)
      local ended
      if q[2] > 0 then
        ended = st[1] + q[2] <= now
      else
        ended = st[1] < self.bounds(p, now)
      end
      if ended then
        return false
      end
      local at = st[1]
      if now > at then
        at = now
      end
      local start, ends = self.bounds(p, at)
      store(key, p, format(p.f2, start, st[2]), ends, keep, since)
      return true
    end,
    -- Whether a key's own limit `o` still applies under the policy's `p`: one of calendar
    -- periods ends when the policy no longer counts the same periods (twin of
    -- `FixedWindow::keeps`).
    keeps = function(o, p)
      return o[2] ~= 0 or (p[2] == 0 and o[3] == p[3])
    end,
    -- A lease ends with the window its units are counted in.
    lease_end = function(self, p, st, now, ttl)
      local start, _, ends = self.current(p, st, now)
      local from = now
      if start > from then
        from = start
      end
      local e = from + ttl
      if e > ends - 1 then
        e = ends - 1
      end
      return e
    end,
    -- Gives back to the lease's window only: once another has begun, the units went with it.
    give_back = function(self, key, p, st, now, lease_end, units, keep, since)
      if self.current(p, st, now) == self.bounds(p, lease_end) then
        self:refund(key, p, st, now, units, keep, since)
      end
    end,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local start, count, ends = self.current(p, st, now)
      local left = count - units
      if left < 0 then
        left = 0
      end
      store(key, p, format(p.f2, start, left), ends, keep, since)
    end,
    commit = commit,
  }
end
-- Sliding window counter: twin of sliding_window.rs. Params: limit, buckets, bucket.
-- State: the ring of N + 1 counters indexed by bucket index mod (N + 1), after the head
-- bucket's index, written sparse: "head cell:count ...", the counters that are not zero (a
-- key spends a few buckets of its ring, so a decision parses and writes a few numbers, not
-- N + 2). Read as a table { head, c0, c1, ..., cN }. The dense form of earlier versions,
-- "head c0 c1 ... cN", is still read.
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[2] = function()
  -- The parameters of a tag found in a state written under others.
  local OLD_RING = {}

  local function sw_read(raw, cells)
    if not raw then
      return nil
    end
    if not find(raw, ':', 1, true) and find(raw, ' ', 1, true) then
      return parse(raw, cells + 1)
    end
    local head = tonumber(match(raw, '^(%d+)'))
    if not head then
      return nil
    end
    local st = { head }
    for k = 2, cells + 1 do
      st[k] = 0
    end
    for cell, count in string.gmatch(raw, ' (%d+):(%d+)') do
      cell = tonumber(cell)
      if cell >= cells then
        return nil
      end
      st[cell + 2] = tonumber(count)
    end
    return st
  end

  -- Writes the ring of `st` (its counters at st[2] .. st[cells + 1]) after `head`, sparse.
  --@inline
  local function sw_write(key, p, head, st, cells, expires_at, keep, since)
    local bucket = '%d:' .. INT
    local parts = { format(INT, head) }
    for i = 1, cells do
      local count = st[i + 1]
      if count > 0 then
        parts[#parts + 1] = format(bucket, i - 1, count)
      end
    end
    store(key, p, table.concat(parts, ' ') .. p.tag, expires_at, keep, since)
  end

  --@inline
  local function sw_count(p, st, index)
    if st and index <= st[1] and index + p[2] >= st[1] then
      local wraps = fdiv(index, p[2] + 1)
      local cell = index - wraps * (p[2] + 1)
      return st[cell + 2]
    end
    return 0
  end

  --@inline
  local function sw_position(p, st, now)
    local c = fdiv(now, p[3])
    if st and st[1] > c then
      return st[1], 0
    end
    return c, now - c * p[3]
  end

  --@inline
  local function sw_estimate(p, st, c, x)
    local n, g = p[2], p[3]
    local whole = 0
    if st then
      -- The buckets c + 1 - n .. c that the ring holds (head - n .. head), walked cell by
      -- cell: one division, not one per bucket.
      local lo, hi = c + 1 - n, c
      if lo < 0 then
        lo = 0
      end
      if lo < st[1] - n then
        lo = st[1] - n
      end
      if hi > st[1] then
        hi = st[1]
      end
      local cells = n + 1
      local wraps = fdiv(lo, cells)
      local cell = lo - wraps * cells
      for _ = lo, hi do
        whole = whole + st[cell + 2]
        cell = cell + 1
        if cell == cells then
          cell = 0
        end
      end
    end
    local oldest = 0
    if c >= n then
      oldest = sw_count(p, st, c - n)
    end
    local part = cdiv(oldest * (g - x), g)
    return whole + part
  end

  local function sw_reset(p, st, c, x)
    local n, g = p[2], p[3]
    local now = c * g + x
    local from = c - n
    if from < 0 then
      from = 0
    end
    for j = c, from, -1 do
      if sw_count(p, st, j) > 0 then
        return (j + n + 1) * g - now
      end
    end
    return 0
  end

  --@inline
  local function load(key, p)
    local raw = call('GET', key)
    if not raw then
      return nil
    end
    local bare = untagged(raw, p.tag)
    if bare then
      -- Tagged with the present parameters, no block: the state is what precedes the tag.
      return sw_read(bare, p[2] + 1) or false
    end
    local tag, ends
    raw, tag, ends = split_state(raw)
    if tag and tag ~= p.tag then
      -- Written under other parameters: read with their ring (their number of buckets is
      -- the tag's second parameter).
      local n = tag_params(tag, OLD_RING) and OLD_RING[2]
      return (n and sw_read(raw, n + 1)) or false, ends, tag
    end
    return sw_read(raw, p[2] + 1) or false, ends
  end

  --@inline
  local function lag(p, st, now)
    if st and st[1] * p[3] > now then
      return st[1] * p[3] - now
    end
    return 0
  end

  -- A request denied now, or not charged, at bucket `c` and `x` into it: the verdict, the
  -- remaining and reset, and when not admitted, the wait until the first bucket with room.
  local function sw_denied(p, st, c, x, cost, used, remaining)
    local limit, n, g = p[1], p[2], p[3]
    local reset_now = sw_reset(p, st, c, x)
    if cost > limit then
      return 0, remaining, reset_now, -1
    end
    if used + cost <= limit then
      return 1, remaining - cost, reset_now, -1
    end
    local now_abs = c * g + x
    for k = 0, n + 1 do
      local q = c + k
      local whole = 0
      local from = q + 1 - n
      if from < 0 then
        from = 0
      end
      for i = from, q do
        if i <= c then
          whole = whole + sw_count(p, st, i)
        end
      end
      local avail = limit - (cost + whole)
      if avail >= 0 then
        local oldest = 0
        if q >= n and q - n <= c then
          oldest = sw_count(p, st, q - n)
        end
        local x0 = 0
        if k == 0 then
          x0 = x
        end
        local xmin = x0
        if oldest > 0 then
          local part = fdiv(avail * g, oldest)
          local bound = g - part
          if bound > xmin then
            xmin = bound
          end
        end
        if xmin < g then
          return 0, remaining, reset_now, q * g + xmin - now_abs
        end
      end
    end
    return redis.error_reply('sliding_window: no retry time found')
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local limit, n, g = p[1], p[2], p[3]
    local c, x = sw_position(p, st, now)
    local used = sw_estimate(p, st, c, x)
    local remaining = limit - used
    if remaining < 0 then
      remaining = 0
    end
    if used + cost <= limit and cost > 0 then
      -- Admitted and charged: the window is empty once this bucket has left it.
      return 1, remaining - cost, (n + 1) * g - x, -1
    end
    return sw_denied(p, st, c, x, cost, used, remaining)
  end

  --@inline
  local function commit(self, key, p, st, now, cost, keep, since)
    local n, g = p[2], p[3]
    local cells = n + 1
    local c = sw_position(p, st, now)
    local wraps = fdiv(c, cells)
    local cell = c - wraps * cells
    if not st then
      -- A new key: one bucket, written without building its ring.
      local value = format(INT .. ' %d:' .. INT, c, cell, cost) .. p.tag
      store(key, p, value, (c + cells) * g, keep, since)
    else
      -- The ring read for this decision, updated in place: buckets that left it emptied.
      local head = st[1]
      if c > head then
        local stale = c - head
        if stale > cells then
          stale = cells
        end
        -- Bucket c - i is at the ring's cell `cell - i`, wrapped.
        local back = cell
        for _ = 1, stale do
          st[back + 2] = 0
          back = back - 1
          if back < 0 then
            back = cells - 1
          end
        end
        head = c
      end
      st[cell + 2] = st[cell + 2] + cost
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    repeat -- evaluate
      local limit, n, g = p[1], p[2], p[3]
      local c, x
      repeat -- sw_position
        local c_2
        do -- fdiv
          local b = p[3]
          c_2 = (now - now % b) / b
        end
        if st and st[1] > c_2 then
          c, x = st[1], 0 break
        end
        c, x = c_2, now - c_2 * p[3] break
      until true
      local used
      do -- sw_estimate
        local n, g = p[2], p[3]
        local whole = 0
        if st then
          local lo, hi = c + 1 - n, c
          if lo < 0 then
            lo = 0
          end
          if lo < st[1] - n then
            lo = st[1] - n
          end
          if hi > st[1] then
            hi = st[1]
          end
          local cells = n + 1
          local wraps
          do -- fdiv
            wraps = (lo - lo % cells) / cells
          end
          local cell = lo - wraps * cells
          for _ = lo, hi do
            whole = whole + st[cell + 2]
            cell = cell + 1
            if cell == cells then
              cell = 0
            end
          end
        end
        local oldest = 0
        if c >= n then
          repeat -- sw_count
            local index = c - n
            if st and index <= st[1] and index + p[2] >= st[1] then
              local wraps
              do -- fdiv
                local b = p[2] + 1
                wraps = (index - index % b) / b
              end
              local cell = index - wraps * (p[2] + 1)
              oldest = st[cell + 2] break
            end
            oldest = 0 break
          until true
        end
        local part
        do -- cdiv
          local a = oldest * (g - x)
          part = (a + (-a) % g) / g
        end
        used = whole + part
      end
      local remaining_1 = limit - used
      if remaining_1 < 0 then
        remaining_1 = 0
      end
      if used + cost <= limit and cost > 0 then
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, remaining_1 - cost, (n + 1) * g - x, -1 break
      end
      ok, remaining, reset, retry, seen1, seen2, seen3 = sw_denied(p, st, c, x, cost, used, remaining_1) break
    until true
    local behind
    repeat -- lag
      if st and st[1] * p[3] > now then
        behind = st[1] * p[3] - now break
      end
      behind = 0 break
    until true
    if behind > 0 then
      do -- shift
        local ok_10, remaining_10, reset_10, retry_10 = ok, remaining, reset, retry
        if behind > 0 then
          remaining_10 = 0
          reset_10 = reset_10 + behind
          if retry_10 >= 0 then
            retry_10 = retry_10 + behind
          end
          if ok_10 == 1 and cost > 0 then
            ok_10, retry_10 = 0, behind
            if reset_10 < behind then
              reset_10 = behind
            end
          end
        end
        ok, remaining, reset, retry = ok_10, remaining_10, reset_10, retry_10
      end
    end
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- load
        local raw = call('GET', key)
        if not raw then
          st, ends, stale = nil break
        end
        local bare
        repeat -- untagged
          local tag = p.tag
          if find(raw, tag, #raw - #tag + 1, true) then
            bare = sub(raw, 1, #raw - #tag) break
          end
          bare = nil break
        until true
        if bare then
          st, ends, stale = sw_read(bare, p[2] + 1) or false break
        end
        local tag, ends_40
        raw, tag, ends_40 = split_state(raw)
        if tag and tag ~= p.tag then
          local n = tag_params(tag, OLD_RING) and OLD_RING[2]
          st, ends, stale = (n and sw_read(raw, n + 1)) or false, ends_40, tag break
        end
        st, ends, stale = sw_read(raw, p[2] + 1) or false, ends_40 break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          repeat -- evaluate
            local limit, n, g = q[1], q[2], q[3]
            local c, x
            repeat -- sw_position
              local c_45
              do -- fdiv
                local b = q[3]
                c_45 = (now - now % b) / b
              end
              if st and st[1] > c_45 then
                c, x = st[1], 0 break
              end
              c, x = c_45, now - c_45 * q[3] break
            until true
            local used
            do -- sw_estimate
              local n, g = q[2], q[3]
              local whole = 0
              if st then
                local lo, hi = c + 1 - n, c
                if lo < 0 then
                  lo = 0
                end
                if lo < st[1] - n then
                  lo = st[1] - n
                end
                if hi > st[1] then
                  hi = st[1]
                end
                local cells = n + 1
                local wraps
                do -- fdiv
                  wraps = (lo - lo % cells) / cells
                end
                local cell = lo - wraps * cells
                for _ = lo, hi do
                  whole = whole + st[cell + 2]
                  cell = cell + 1
                  if cell == cells then
                    cell = 0
                  end
                end
              end
              local oldest = 0
              if c >= n then
                repeat -- sw_count
                  local index = c - n
                  if st and index <= st[1] and index + q[2] >= st[1] then
                    local wraps
                    do -- fdiv
                      local b = q[2] + 1
                      wraps = (index - index % b) / b
                    end
                    local cell = index - wraps * (q[2] + 1)
                    oldest = st[cell + 2] break
                  end
                  oldest = 0 break
                until true
              end
              local part
              do -- cdiv
                local a = oldest * (g - x)
                part = (a + (-a) % g) / g
              end
              used = whole + part
            end
            local remaining_44 = limit - used
            if remaining_44 < 0 then
              remaining_44 = 0
            end
            if used + cost <= limit and cost > 0 then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, remaining_44 - cost, (n + 1) * g - x, -1 break
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = sw_denied(q, st, c, x, cost, used, remaining_44) break
          until true
          local behind
          repeat -- lag
            if st and st[1] * q[3] > now then
              behind = st[1] * q[3] - now break
            end
            behind = 0 break
          until true
          if behind > 0 then
            do -- shift
              local ok_53, remaining_53, reset_53, retry_53 = ok, remaining, reset, retry
              if behind > 0 then
                remaining_53 = 0
                reset_53 = reset_53 + behind
                if retry_53 >= 0 then
                  retry_53 = retry_53 + behind
                end
                if ok_53 == 1 and cost > 0 then
                  ok_53, retry_53 = 0, behind
                  if reset_53 < behind then
                    reset_53 = behind
                  end
                end
              end
              ok, remaining, reset, retry = ok_53, remaining_53, reset_53, retry_53
            end
          end
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_54 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_54 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_54 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            local n, g = q[2], q[3]
            local cells = n + 1
            local c
            repeat -- sw_position
              local c_56
              do -- fdiv
                local b = q[3]
                c_56 = (now - now % b) / b
              end
              if st and st[1] > c_56 then
                c = st[1], 0 break
              end
              c = c_56, now - c_56 * q[3] break
            until true
            local wraps
            do -- fdiv
              wraps = (c - c % cells) / cells
            end
            local cell = c - wraps * cells
            if not st then
              local value = format(INT .. ' %d:' .. INT, c, cell, cost) .. q.tag
              repeat -- store
                local value, expires_at = value, (c + cells) * g
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_61 = expires_at
                    local at = expires_at_61
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            else
              local head = st[1]
              if c > head then
                local stale = c - head
                if stale > cells then
                  stale = cells
                end
                local back = cell
                for _ = 1, stale do
                  st[back + 2] = 0
                  back = back - 1
                  if back < 0 then
                    back = cells - 1
                  end
                end
                head = c
              end
              st[cell + 2] = st[cell + 2] + cost
              repeat -- sw_write
                local expires_at = (head + cells) * g
                local bucket = '%d:' .. INT
                local parts = { format(INT, head) }
                for i = 1, cells do
                  local count = st[i + 1]
                  if count > 0 then
                    parts[#parts + 1] = format(bucket, i - 1, count)
                  end
                end
                repeat -- store
                  local value, expires_at = table.concat(parts, ' ') .. q.tag, expires_at
                  if q.limit_end and q.limit_end > expires_at then
                    expires_at = q.limit_end
                  end
                  if ends then
                    local block_end
                    do -- int
                      block_end = format(INT, ends)
                    end
                    value = value .. '|' .. block_end
                    do -- until_block_ends
                      local expires_at_67 = expires_at
                      local at = expires_at_67
                      if ends and ends > at then
                        at = ends
                      end
                      expires_at = at
                    end
                  end
                  local ms
                  do -- ttl_ms
                    do -- cdiv
                      local a = expires_at - since
                      ms = (a + (-a) % 1000) / 1000
                    end
                    if ms < 1 then
                      ms = 1
                    end
                  end
                  call('SET', key, value, 'PX', format(INT, ms))
                until true
              until true
            end
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_54 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_54) break
      end
      total = total_54 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- load
        local raw = call('GET', key)
        if not raw then
          st, ends, stale = nil break
        end
        local bare
        repeat -- untagged
          local tag = p.tag
          if find(raw, tag, #raw - #tag + 1, true) then
            bare = sub(raw, 1, #raw - #tag) break
          end
          bare = nil break
        until true
        if bare then
          st, ends, stale = sw_read(bare, p[2] + 1) or false break
        end
        local tag, ends_73
        raw, tag, ends_73 = split_state(raw)
        if tag and tag ~= p.tag then
          local n = tag_params(tag, OLD_RING) and OLD_RING[2]
          st, ends, stale = (n and sw_read(raw, n + 1)) or false, ends_73, tag break
        end
        st, ends, stale = sw_read(raw, p[2] + 1) or false, ends_73 break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        repeat -- evaluate
          local limit, n, g = q[1], q[2], q[3]
          local c, x
          repeat -- sw_position
            local c_78
            do -- fdiv
              local b = q[3]
              c_78 = (now - now % b) / b
            end
            if st and st[1] > c_78 then
              c, x = st[1], 0 break
            end
            c, x = c_78, now - c_78 * q[3] break
          until true
          local used
          do -- sw_estimate
            local n, g = q[2], q[3]
            local whole = 0
            if st then
              local lo, hi = c + 1 - n, c
              if lo < 0 then
                lo = 0
              end
              if lo < st[1] - n then
                lo = st[1] - n
              end
              if hi > st[1] then
                hi = st[1]
              end
              local cells = n + 1
              local wraps
              do -- fdiv
                wraps = (lo - lo % cells) / cells
              end
              local cell = lo - wraps * cells
              for _ = lo, hi do
                whole = whole + st[cell + 2]
                cell = cell + 1
                if cell == cells then
                  cell = 0
                end
              end
            end
            local oldest = 0
            if c >= n then
              repeat -- sw_count
                local index = c - n
                if st and index <= st[1] and index + q[2] >= st[1] then
                  local wraps
                  do -- fdiv
                    local b = q[2] + 1
                    wraps = (index - index % b) / b
                  end
                  local cell = index - wraps * (q[2] + 1)
                  oldest = st[cell + 2] break
                end
                oldest = 0 break
              until true
            end
            local part
            do -- cdiv
              local a = oldest * (g - x)
              part = (a + (-a) % g) / g
            end
            used = whole + part
          end
          local remaining_77 = limit - used
          if remaining_77 < 0 then
            remaining_77 = 0
          end
          if used + cost <= limit and cost > 0 then
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, remaining_77 - cost, (n + 1) * g - x, -1 break
          end
          ok, remaining, reset, retry, seen1, seen2, seen3 = sw_denied(q, st, c, x, cost, used, remaining_77) break
        until true
        local behind
        repeat -- lag
          if st and st[1] * q[3] > now then
            behind = st[1] * q[3] - now break
          end
          behind = 0 break
        until true
        if behind > 0 then
          do -- shift
            local ok_86, remaining_86, reset_86, retry_86 = ok, remaining, reset, retry
            if behind > 0 then
              remaining_86 = 0
              reset_86 = reset_86 + behind
              if retry_86 >= 0 then
                retry_86 = retry_86 + behind
              end
              if ok_86 == 1 and cost > 0 then
                ok_86, retry_86 = 0, behind
                if reset_86 < behind then
                  reset_86 = behind
                end
              end
            end
            ok, remaining, reset, retry = ok_86, remaining_86, reset_86, retry_86
          end
        end
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            local n, g = q[2], q[3]
            local cells = n + 1
            local c
            repeat -- sw_position
              local c_89
              do -- fdiv
                local b = q[3]
                c_89 = (now - now % b) / b
              end
              if st and st[1] > c_89 then
                c = st[1], 0 break
              end
              c = c_89, now - c_89 * q[3] break
            until true
            local wraps
            do -- fdiv
              wraps = (c - c % cells) / cells
            end
            local cell = c - wraps * cells
            if not st then
              local value = format(INT .. ' %d:' .. INT, c, cell, cost) .. q.tag
              repeat -- store
                local value, expires_at = value, (c + cells) * g
                if q.limit_end and q.limit_end > expires_at then
                  expires_at = q.limit_end
                end
                if ends then
                  local block_end
                  do -- int
                    block_end = format(INT, ends)
                  end
                  value = value .. '|' .. block_end
                  do -- until_block_ends
                    local expires_at_94 = expires_at
                    local at = expires_at_94
                    if ends and ends > at then
                      at = ends
                    end
                    expires_at = at
                  end
                end
                local ms
                do -- ttl_ms
                  do -- cdiv
                    local a = expires_at - since
                    ms = (a + (-a) % 1000) / 1000
                  end
                  if ms < 1 then
                    ms = 1
                  end
                end
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            else
              local head = st[1]
              if c > head then
                local stale = c - head
                if stale > cells then
                  stale = cells
                end
                local back = cell
                for _ = 1, stale do
                  st[back + 2] = 0
                  back = back - 1
                  if back < 0 then
                    back = cells - 1
                  end
                end
                head = c
              end
              st[cell + 2] = st[cell + 2] + cost
              repeat -- sw_write
                local expires_at = (head + cells) * g
                local bucket = '%d:' .. INT
                local parts = { format(INT, head) }
                for i = 1, cells do
                  local count = st[i + 1]
                  if count > 0 then
                    parts[#parts + 1] = format(bucket, i - 1, count)
                  end
                end
                repeat -- store
                  local value, expires_at = table.concat(parts, ' ') .. q.tag, expires_at
                  if q.limit_end and q.limit_end > expires_at then
                    expires_at = q.limit_end
                  end
                  if ends then
                    local block_end
                    do -- int
                      block_end = format(INT, ends)
                    end
                    value = value .. '|' .. block_end
                    do -- until_block_ends
                      local expires_at_100 = expires_at
                      local at = expires_at_100
                      if ends and ends > at then
                        at = ends
                      end
                      expires_at = at
                    end
                  end
                  local ms
                  do -- ttl_ms
                    do -- cdiv
                      local a = expires_at - since
                      ms = (a + (-a) % 1000) / 1000
                    end
                    if ms < 1 then
                      ms = 1
                    end
                  end
                  call('SET', key, value, 'PX', format(INT, ms))
                until true
              until true
            end
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    block = block_in_value,
    load = load,
    -- Twin of `SlidingWindow::convert`: each old bucket still in the window moves, with its
    -- count, to the new bucket holding its last microsecond (the present's for the present's).
    convert = function(self, key, q, p, st, now, keep, since)
      local n, g = p[2], p[3]
      local present = fdiv(now, g)
      local from = st[1] - q[2]
      if from < 0 then
        from = 0
      end
      local moved, head = {}, nil
      for i = from, st[1] do
        local count = sw_count(q, st, i)
        local j = fdiv(i * q[3], g)
        if present > j then
          j = present
        end
        local last = fdiv((i + 1) * q[3] - 1, g)
        if last < j then
          j = last
        end
        -- Kept while the new window counts it.
        if count > 0 and (j + n + 1) * g > now then
          moved[#moved + 1] = j
          moved[#moved + 1] = count
          if not head or j > head then
            head = j
          end
        end
      end
      if not head then
        return false
      end
      local cells = n + 1
      local ring = { head }
      for k = 2, cells + 1 do
        ring[k] = 0
      end
      for k = 1, #moved, 2 do
        local j = moved[k]
        if j + n < head then
          -- Older than the new ring holds: into its oldest bucket.
          j = head - n
        end
        local cell = j - fdiv(j, cells) * cells + 2
        local c = ring[cell] + moved[k + 1]
        if c > 4294967295 then
          c = 4294967295
        end
        ring[cell] = c
      end
      sw_write(key, p, head, ring, cells, (head + cells) * g, keep, since)
      return true
    end,
    lag = lag,
    evaluate = evaluate,
    -- A lease ends with the bucket its units are counted in.
    lease_end = function(self, p, st, now, ttl)
      local g = p[3]
      local c = sw_position(p, st, now)
      local from = now
      if c * g > from then
        from = c * g
      end
      local e = from + ttl
      if e > (c + 1) * g - 1 then
        e = (c + 1) * g - 1
      end
      return e
    end,
    -- Gives back to the lease's bucket, while the ring still counts it.
    give_back = function(self, key, p, st, now, lease_end, units, keep, since)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local cells = n + 1
      local b = fdiv(lease_end, g)
      local head = st[1]
      if b > head or b + n < head then
        return
      end
      local cell = b - fdiv(b, cells) * cells + 2
      local take = st[cell]
      if take > units then
        take = units
      end
      st[cell] = st[cell] - take
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local cells = n + 1
      local c = sw_position(p, st, now)
      local head = st[1]
      local oldest = c - n
      if head - n > oldest then
        oldest = head - n
      end
      if oldest < 0 then
        oldest = 0
      end
      local i = head
      if c < i then
        i = c
      end
      local left = units
      while left > 0 and i >= oldest do
        local cell = i - fdiv(i, cells) * cells + 2
        local take = st[cell]
        if take > left then
          take = left
        end
        st[cell] = st[cell] - take
        left = left - take
        i = i - 1
      end
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end,
    commit = commit,
  }
end
-- Sliding log: twin of sliding_log.rs. Params: limit, window. State: a sorted set with one
-- member per admitted unit, scored by its time; members are "time:sequence", the sequence
-- zero-padded so that members of one time sort by it, and numbered on from the newest member
-- of that time (never reused while that member exists, even after a refund).
-- A block is one more member, "block:end", scored +inf: always the highest, never inside a
-- window (counts stop short of +inf), so the read of the newest entry finds it too. A key's
-- own limit is another, "limit:TAG" (TAG: the parameters it is decided under, see
-- `own_params`), above the block.
ALG[3] = function()
  local LETTER_B = 98 -- the first byte of "block:"
  local LETTER_L = 108 -- the first byte of "limit:"

  -- In-window entries: scores after `cutoff`, short of the block's +inf.
  --@inline
  local function in_window(key, cutoff)
    local after = int(cutoff)
    return call('ZCOUNT', key, '(' .. after, '(+inf')
  end

  -- Logs `cost` units at `at` (now, or a lease's end) and drops the entries out of the window
  -- at `now`. The members of one time are numbered on from the highest there: the newest
  -- entry's when it has that time, else found with one more read (only when something newer
  -- than `at` is logged: a lease's units, or a clock that went back).
  --@inline
  local function log(key, p, st, now, at, cost, keep, since)
    local window = p[2]
    local gone = int(now - window)
    call('ZREMRANGEBYSCORE', key, '-inf', gone)
    local seq = 0
    local t = int(at)
    if st and st[1] == at then
      seq = tonumber(match(st[2], ':(%d+)$')) or 0
    elseif st and st[1] > at then
      local top = call('ZREVRANGEBYSCORE', key, t, t, 'LIMIT', 0, 1)
      if top[1] then
        seq = tonumber(match(top[1], ':(%d+)$')) or 0
      end
    end
    if cost == 1 then
      call('ZADD', key, t, t .. ':' .. format('%010d', seq + 1))
    end
    -- One member per unit, added in batches (Lua's unpack has a small stack).
    local i = 1
    while cost > 1 and i <= cost do
      local args = {}
      local last = i + 499
      if last > cost then
        last = cost
      end
      for j = i, last do
        args[#args + 1] = t
        args[#args + 1] = t .. ':' .. format('%010d', seq + j)
      end
      call('ZADD', key, unpack(args))
      i = last + 1
    end
    local newest = now
    if st and st[1] > newest then
      newest = st[1]
    end
    if cost > 0 and at > newest then
      newest = at
    end
    local expires_at = until_block_ends(newest + window, keep)
    if p.limit_end and p.limit_end > expires_at then
      expires_at = p.limit_end
    end
    local ms = ttl_ms(since, expires_at)
    call('PEXPIRE', key, format(INT, ms))
  end

  -- The newest entry (in `into`), the end of the block on record, if any, and the tag of the
  -- key's own limit, if it has one (read as a state written under other parameters).
  --@inline
  local function load(key, p, now, into)
    local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
    local n = #top
    if n == 0 then
      return nil
    end
    local ends, own
    if byte(top[n - 1], 1) == LETTER_L then
      own = sub(top[n - 1], 7)
      top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
      n = #top
    end
    if n > 0 and byte(top[n - 1], 1) == LETTER_B then
      ends = tonumber(sub(top[n - 1], 7))
      n = n - 2
    end
    if n == 0 then
      return false, ends, own
    end
    into[1], into[2] = tonumber(top[n]), top[n - 1]
    return into, ends, own
  end

  --@inline
  local function evaluate(self, p, st, now, cost, key)
    local limit, window = p[1], p[2]
    if not st then
      if cost > limit then
        return 0, limit, 0, -1
      end
      local reset = 0
      if cost > 0 then
        reset = window
      end
      return 1, limit - cost, reset, -1
    end
    local used = in_window(key, now - window)
    local newest_left = 0
    if used > 0 then
      newest_left = st[1] + window - now
    end
    local left = limit - used
    if left < 0 then
      left = 0
    end
    if cost > limit then
      return 0, left, newest_left, -1
    end
    if used + cost <= limit then
      local reset = newest_left
      if cost > 0 then
        reset = window
      end
      return 1, limit - used - cost, reset, -1
    end
    -- The entry whose leaving the window makes room.
    local need = used + cost - limit
    local start = int(now - window)
    local entry = call('ZRANGEBYSCORE', key, '(' .. start, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
    return 0, left, newest_left, tonumber(entry[2]) + window - now
  end

  --@inline
  local function commit(self, key, p, st, now, cost, keep, since)
    log(key, p, st, now, now, cost, keep, since)
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    repeat -- evaluate
      local limit, window = p[1], p[2]
      if not st then
        if cost > limit then
          ok, remaining, reset, retry, seen1, seen2, seen3 = 0, limit, 0, -1 break
        end
        local reset_1 = 0
        if cost > 0 then
          reset_1 = window
        end
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - cost, reset_1, -1 break
      end
      local used
      do -- in_window
        local cutoff = now - window
        local after
        do -- int
          after = format(INT, cutoff)
        end
        used = call('ZCOUNT', key, '(' .. after, '(+inf')
      end
      local newest_left = 0
      if used > 0 then
        newest_left = st[1] + window - now
      end
      local left = limit - used
      if left < 0 then
        left = 0
      end
      if cost > limit then
        ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, -1 break
      end
      if used + cost <= limit then
        local reset_1 = newest_left
        if cost > 0 then
          reset_1 = window
        end
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - used - cost, reset_1, -1 break
      end
      local need = used + cost - limit
      local start
      do -- int
        local n = now - window
        start = format(INT, n)
      end
      local entry = call('ZRANGEBYSCORE', key, '(' .. start, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
      ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, tonumber(entry[2]) + window - now break
    until true
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- load
        local into = STATES[i]
        local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
        local n = #top
        if n == 0 then
          st, ends, stale = nil break
        end
        local ends_19, own
        if byte(top[n - 1], 1) == LETTER_L then
          own = sub(top[n - 1], 7)
          top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
          n = #top
        end
        if n > 0 and byte(top[n - 1], 1) == LETTER_B then
          ends_19 = tonumber(sub(top[n - 1], 7))
          n = n - 2
        end
        if n == 0 then
          st, ends, stale = false, ends_19, own break
        end
        into[1], into[2] = tonumber(top[n]), top[n - 1]
        st, ends, stale = into, ends_19, own break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          repeat -- evaluate
            local limit, window = q[1], q[2]
            if not st then
              if cost > limit then
                ok, remaining, reset, retry, seen1, seen2, seen3 = 0, limit, 0, -1 break
              end
              local reset_22 = 0
              if cost > 0 then
                reset_22 = window
              end
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - cost, reset_22, -1 break
            end
            local used
            do -- in_window
              local cutoff = now - window
              local after
              do -- int
                after = format(INT, cutoff)
              end
              used = call('ZCOUNT', key, '(' .. after, '(+inf')
            end
            local newest_left = 0
            if used > 0 then
              newest_left = st[1] + window - now
            end
            local left = limit - used
            if left < 0 then
              left = 0
            end
            if cost > limit then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, -1 break
            end
            if used + cost <= limit then
              local reset_22 = newest_left
              if cost > 0 then
                reset_22 = window
              end
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - used - cost, reset_22, -1 break
            end
            local need = used + cost - limit
            local start
            do -- int
              local n = now - window
              start = format(INT, n)
            end
            local entry = call('ZRANGEBYSCORE', key, '(' .. start, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, tonumber(entry[2]) + window - now break
          until true
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_26 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_26 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_26 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            repeat -- log
              local at = now
              local window = q[2]
              local gone
              do -- int
                local n = now - window
                gone = format(INT, n)
              end
              call('ZREMRANGEBYSCORE', key, '-inf', gone)
              local seq = 0
              local t
              do -- int
                t = format(INT, at)
              end
              if st and st[1] == at then
                seq = tonumber(match(st[2], ':(%d+)$')) or 0
              elseif st and st[1] > at then
                local top = call('ZREVRANGEBYSCORE', key, t, t, 'LIMIT', 0, 1)
                if top[1] then
                  seq = tonumber(match(top[1], ':(%d+)$')) or 0
                end
              end
              if cost == 1 then
                call('ZADD', key, t, t .. ':' .. format('%010d', seq + 1))
              end
              local i = 1
              while cost > 1 and i <= cost do
                local args = {}
                local last = i + 499
                if last > cost then
                  last = cost
                end
                for j = i, last do
                  args[#args + 1] = t
                  args[#args + 1] = t .. ':' .. format('%010d', seq + j)
                end
                call('ZADD', key, unpack(args))
                i = last + 1
              end
              local newest = now
              if st and st[1] > newest then
                newest = st[1]
              end
              if cost > 0 and at > newest then
                newest = at
              end
              local expires_at
              do -- until_block_ends
                local expires_at_31 = newest + window
                local at = expires_at_31
                if ends and ends > at then
                  at = ends
                end
                expires_at = at
              end
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('PEXPIRE', key, format(INT, ms))
            until true
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_26 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_26) break
      end
      total = total_26 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- load
        local into = STATES[1]
        local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
        local n = #top
        if n == 0 then
          st, ends, stale = nil break
        end
        local ends_37, own
        if byte(top[n - 1], 1) == LETTER_L then
          own = sub(top[n - 1], 7)
          top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
          n = #top
        end
        if n > 0 and byte(top[n - 1], 1) == LETTER_B then
          ends_37 = tonumber(sub(top[n - 1], 7))
          n = n - 2
        end
        if n == 0 then
          st, ends, stale = false, ends_37, own break
        end
        into[1], into[2] = tonumber(top[n]), top[n - 1]
        st, ends, stale = into, ends_37, own break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        repeat -- evaluate
          local limit, window = q[1], q[2]
          if not st then
            if cost > limit then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 0, limit, 0, -1 break
            end
            local reset_40 = 0
            if cost > 0 then
              reset_40 = window
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - cost, reset_40, -1 break
          end
          local used
          do -- in_window
            local cutoff = now - window
            local after
            do -- int
              after = format(INT, cutoff)
            end
            used = call('ZCOUNT', key, '(' .. after, '(+inf')
          end
          local newest_left = 0
          if used > 0 then
            newest_left = st[1] + window - now
          end
          local left = limit - used
          if left < 0 then
            left = 0
          end
          if cost > limit then
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, -1 break
          end
          if used + cost <= limit then
            local reset_40 = newest_left
            if cost > 0 then
              reset_40 = window
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, limit - used - cost, reset_40, -1 break
          end
          local need = used + cost - limit
          local start
          do -- int
            local n = now - window
            start = format(INT, n)
          end
          local entry = call('ZRANGEBYSCORE', key, '(' .. start, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
          ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, newest_left, tonumber(entry[2]) + window - now break
        until true
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            repeat -- log
              local at = now
              local window = q[2]
              local gone
              do -- int
                local n = now - window
                gone = format(INT, n)
              end
              call('ZREMRANGEBYSCORE', key, '-inf', gone)
              local seq = 0
              local t
              do -- int
                t = format(INT, at)
              end
              if st and st[1] == at then
                seq = tonumber(match(st[2], ':(%d+)$')) or 0
              elseif st and st[1] > at then
                local top = call('ZREVRANGEBYSCORE', key, t, t, 'LIMIT', 0, 1)
                if top[1] then
                  seq = tonumber(match(top[1], ':(%d+)$')) or 0
                end
              end
              if cost == 1 then
                call('ZADD', key, t, t .. ':' .. format('%010d', seq + 1))
              end
              local i = 1
              while cost > 1 and i <= cost do
                local args = {}
                local last = i + 499
                if last > cost then
                  last = cost
                end
                for j = i, last do
                  args[#args + 1] = t
                  args[#args + 1] = t .. ':' .. format('%010d', seq + j)
                end
                call('ZADD', key, unpack(args))
                i = last + 1
              end
              local newest = now
              if st and st[1] > newest then
                newest = st[1]
              end
              if cost > 0 and at > newest then
                newest = at
              end
              local expires_at
              do -- until_block_ends
                local expires_at_49 = newest + window
                local at = expires_at_49
                if ends and ends > at then
                  at = ends
                end
                expires_at = at
              end
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('PEXPIRE', key, format(INT, ms))
            until true
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    load = load,
    -- The key's own limit, `to` (nil: none): its member replaced, the key living until it
    -- ends.
    mark = function(self, key, to, now, keep, since)
      self.unmark(key, LETTER_L)
      if to.limit_end then
        call('ZADD', key, '+inf', 'limit:' .. to.tag)
        local ms = ttl_ms(since, to.limit_end)
        if call('PTTL', key) < ms then
          call('PEXPIRE', key, format(INT, ms))
        end
      end
    end,
    -- Removes the member at +inf that starts with `letter` (the block or the limit; the
    -- limit sorts last), by its rank: the commands the decision's ACL line allows.
    unmark = function(key, letter)
      local top = call('ZRANGEBYSCORE', key, '+inf', '+inf')
      for i = #top, 1, -1 do
        if byte(top[i], 1) == letter then
          local rank = i - #top - 1
          call('ZREMRANGEBYRANK', key, rank, rank)
          return
        end
      end
    end,
    block = function(self, key, p, st, now, ends, keep, since)
      self.unmark(key, LETTER_B)
      call('ZADD', key, '+inf', 'block:' .. int(ends))
      call('PEXPIRE', key, ttl_to_block_end(key, since, ends))
    end,
    evaluate = evaluate,
    -- Forgets up to `units` of the newest entries at or before `now` (later ones are a
    -- lease's): they have the highest ranks of those.
    refund = function(self, key, p, st, now, units, keep, since)
      if st and units > 0 then
        local entries = call('ZCOUNT', key, '-inf', int(now))
        local from = entries - units
        if from < 0 then
          from = 0
        end
        if entries > 0 then
          call('ZREMRANGEBYRANK', key, from, entries - 1)
        end
      end
    end,
    commit = commit,
    -- A lease's units are logged at its end.
    lease_commit = function(self, key, p, st, now, ends, units, keep, since)
      log(key, p, st, now, ends, units, keep, since)
    end,
    -- A booked request's units are logged at its booked time, as a lease's at its end.
    book_commit = function(self, key, p, st, now, at, cost, keep, since)
      log(key, p, st, now, at, cost, keep, since)
    end,
    -- Forgets up to `units` of those logged at the lease's end (`ends`).
    give_back = function(self, key, p, st, now, ends, units, keep, since)
      if st and units > 0 then
        -- The entries at `ends` hold the ranks after those before it.
        local at = int(ends)
        local before = call('ZCOUNT', key, '-inf', '(' .. at)
        local here = call('ZCOUNT', key, at, at)
        local take = units
        if take > here then
          take = here
        end
        if take > 0 then
          call('ZREMRANGEBYRANK', key, before + here - take, before + here - 1)
        end
      end
    end,
  }
end
-- Token bucket: twin of token_bucket.rs. Params: capacity, unit, rate, full.
-- State: "tokens last" (tokens in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[4] = function()
  --@inline
  local load = read2

  --@inline
  local lag = bucket_lag

  --@inline
  local function fill(p, amount, elapsed)
    local full, rate = p[4], p[3]
    local a = amount
    if a > full then
      a = full
    end
    local to_full = cdiv(full - a, rate)
    if elapsed >= to_full then
      return full
    end
    return amount + elapsed * rate
  end

  --@inline
  local function elapsed_since(st, now)
    local e = now - st[2]
    if e < 0 then
      return 0
    end
    return e
  end

  -- The tokens in the bucket now.
  --@inline
  local function tokens(p, st, now)
    if not st then
      return p[4]
    end
    local elapsed = elapsed_since(st, now)
    local have = fill(p, st[1], elapsed)
    return have
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
    local have = tokens(p, st, now)
    local need = cost * unit
    if cost <= capacity and have >= need then
      local left = have - need
      local whole = fdiv(left, unit)
      local reset = cdiv(full - left, rate)
      return 1, whole, reset, -1
    end
    -- Denied: what is left now, and when the bucket is full again.
    local whole = fdiv(have, unit)
    local reset = cdiv(full - have, rate)
    if cost > capacity then
      return 0, whole, reset, -1
    end
    local retry = cdiv(need - have, rate)
    return 0, whole, reset, retry
  end

  --@inline
  local function commit(self, key, p, st, now, cost, keep, since)
    local have = tokens(p, st, now)
    have = have - cost * p[2]
    if have < 0 then
      have = 0
    end
    local last = last_after(st, now)
    local to_full = cdiv(p[4] - have, p[3])
    store(key, p, format(p.f2, have, last), last + to_full, keep, since)
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local have
      repeat -- tokens
        if not st then
          have = p[4] break
        end
        local elapsed
        repeat -- elapsed_since
          local e = now - st[2]
          if e < 0 then
            elapsed = 0 break
          end
          elapsed = e break
        until true
        local have_2
        repeat -- fill
          local amount = st[1]
          local full, rate = p[4], p[3]
          local a = amount
          if a > full then
            a = full
          end
          local to_full
          do -- cdiv
            local a = full - a
            to_full = (a + (-a) % rate) / rate
          end
          if elapsed >= to_full then
            have_2 = full break
          end
          have_2 = amount + elapsed * rate break
        until true
        have = have_2 break
      until true
      local need = cost * unit
      if cost <= capacity and have >= need then
        local left = have - need
        local whole
        do -- fdiv
          whole = (left - left % unit) / unit
        end
        local reset_1
        do -- cdiv
          local a = full - left
          reset_1 = (a + (-a) % rate) / rate
        end
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, whole, reset_1, -1 break
      end
      local whole
      do -- fdiv
        whole = (have - have % unit) / unit
      end
      local reset_1
      do -- cdiv
        local a = full - have
        reset_1 = (a + (-a) % rate) / rate
      end
      if cost > capacity then
        ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_1, -1 break
      end
      local retry_1
      do -- cdiv
        local a = need - have
        retry_1 = (a + (-a) % rate) / rate
      end
      ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_1, retry_1 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local ok_13, remaining_13, reset_13, retry_13 = ok, remaining, reset, retry
        if behind > 0 then
          remaining_13 = 0
          reset_13 = reset_13 + behind
          if retry_13 >= 0 then
            retry_13 = retry_13 + behind
          end
          if ok_13 == 1 and cost > 0 then
            ok_13, retry_13 = 0, behind
            if reset_13 < behind then
              reset_13 = behind
            end
          end
        end
        ok, remaining, reset, retry = ok_13, remaining_13, reset_13, retry_13
      end
    end
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[i]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          repeat -- evaluate
            local capacity, unit, rate, full = q[1], q[2], q[3], q[4]
            local have
            repeat -- tokens
              if not st then
                have = q[4] break
              end
              local elapsed
              repeat -- elapsed_since
                local e = now - st[2]
                if e < 0 then
                  elapsed = 0 break
                end
                elapsed = e break
              until true
              local have_46
              repeat -- fill
                local amount = st[1]
                local full, rate = q[4], q[3]
                local a = amount
                if a > full then
                  a = full
                end
                local to_full
                do -- cdiv
                  local a = full - a
                  to_full = (a + (-a) % rate) / rate
                end
                if elapsed >= to_full then
                  have_46 = full break
                end
                have_46 = amount + elapsed * rate break
              until true
              have = have_46 break
            until true
            local need = cost * unit
            if cost <= capacity and have >= need then
              local left = have - need
              local whole
              do -- fdiv
                whole = (left - left % unit) / unit
              end
              local reset_45
              do -- cdiv
                local a = full - left
                reset_45 = (a + (-a) % rate) / rate
              end
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, whole, reset_45, -1 break
            end
            local whole
            do -- fdiv
              whole = (have - have % unit) / unit
            end
            local reset_45
            do -- cdiv
              local a = full - have
              reset_45 = (a + (-a) % rate) / rate
            end
            if cost > capacity then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_45, -1 break
            end
            local retry_45
            do -- cdiv
              local a = need - have
              retry_45 = (a + (-a) % rate) / rate
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_45, retry_45 break
          until true
          local behind
          do -- bucket_lag
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            behind = last - now
          end
          if behind > 0 then
            do -- shift
              local ok_57, remaining_57, reset_57, retry_57 = ok, remaining, reset, retry
              if behind > 0 then
                remaining_57 = 0
                reset_57 = reset_57 + behind
                if retry_57 >= 0 then
                  retry_57 = retry_57 + behind
                end
                if ok_57 == 1 and cost > 0 then
                  ok_57, retry_57 = 0, behind
                  if reset_57 < behind then
                    reset_57 = behind
                  end
                end
              end
              ok, remaining, reset, retry = ok_57, remaining_57, reset_57, retry_57
            end
          end
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_58 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_58 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_58 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            local have
            repeat -- tokens
              if not st then
                have = q[4] break
              end
              local elapsed
              repeat -- elapsed_since
                local e = now - st[2]
                if e < 0 then
                  elapsed = 0 break
                end
                elapsed = e break
              until true
              local have_60
              repeat -- fill
                local amount = st[1]
                local full, rate = q[4], q[3]
                local a = amount
                if a > full then
                  a = full
                end
                local to_full
                do -- cdiv
                  local a = full - a
                  to_full = (a + (-a) % rate) / rate
                end
                if elapsed >= to_full then
                  have_60 = full break
                end
                have_60 = amount + elapsed * rate break
              until true
              have = have_60 break
            until true
            have = have - cost * q[2]
            if have < 0 then
              have = 0
            end
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            local to_full
            do -- cdiv
              local a, b = q[4] - have, q[3]
              to_full = (a + (-a) % b) / b
            end
            repeat -- store
              local value, expires_at = format(q.f2, have, last), last + to_full
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_68 = expires_at
                  local at = expires_at_68
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_58 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_58) break
      end
      total = total_58 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[1]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        repeat -- evaluate
          local capacity, unit, rate, full = q[1], q[2], q[3], q[4]
          local have
          repeat -- tokens
            if not st then
              have = q[4] break
            end
            local elapsed
            repeat -- elapsed_since
              local e = now - st[2]
              if e < 0 then
                elapsed = 0 break
              end
              elapsed = e break
            until true
            local have_78
            repeat -- fill
              local amount = st[1]
              local full, rate = q[4], q[3]
              local a = amount
              if a > full then
                a = full
              end
              local to_full
              do -- cdiv
                local a = full - a
                to_full = (a + (-a) % rate) / rate
              end
              if elapsed >= to_full then
                have_78 = full break
              end
              have_78 = amount + elapsed * rate break
            until true
            have = have_78 break
          until true
          local need = cost * unit
          if cost <= capacity and have >= need then
            local left = have - need
            local whole
            do -- fdiv
              whole = (left - left % unit) / unit
            end
            local reset_77
            do -- cdiv
              local a = full - left
              reset_77 = (a + (-a) % rate) / rate
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, whole, reset_77, -1 break
          end
          local whole
          do -- fdiv
            whole = (have - have % unit) / unit
          end
          local reset_77
          do -- cdiv
            local a = full - have
            reset_77 = (a + (-a) % rate) / rate
          end
          if cost > capacity then
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_77, -1 break
          end
          local retry_77
          do -- cdiv
            local a = need - have
            retry_77 = (a + (-a) % rate) / rate
          end
          ok, remaining, reset, retry, seen1, seen2, seen3 = 0, whole, reset_77, retry_77 break
        until true
        local behind
        do -- bucket_lag
          local last
          repeat -- last_after
            if st and st[2] > now then
              last = st[2] break
            end
            last = now break
          until true
          behind = last - now
        end
        if behind > 0 then
          do -- shift
            local ok_89, remaining_89, reset_89, retry_89 = ok, remaining, reset, retry
            if behind > 0 then
              remaining_89 = 0
              reset_89 = reset_89 + behind
              if retry_89 >= 0 then
                retry_89 = retry_89 + behind
              end
              if ok_89 == 1 and cost > 0 then
                ok_89, retry_89 = 0, behind
                if reset_89 < behind then
                  reset_89 = behind
                end
              end
            end
            ok, remaining, reset, retry = ok_89, remaining_89, reset_89, retry_89
          end
        end
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            local have
            repeat -- tokens
              if not st then
                have = q[4] break
              end
              local elapsed
              repeat -- elapsed_since
                local e = now - st[2]
                if e < 0 then
                  elapsed = 0 break
                end
                elapsed = e break
              until true
              local have_92
              repeat -- fill
                local amount = st[1]
                local full, rate = q[4], q[3]
                local a = amount
                if a > full then
                  a = full
                end
                local to_full
                do -- cdiv
                  local a = full - a
                  to_full = (a + (-a) % rate) / rate
                end
                if elapsed >= to_full then
                  have_92 = full break
                end
                have_92 = amount + elapsed * rate break
              until true
              have = have_92 break
            until true
            have = have - cost * q[2]
            if have < 0 then
              have = 0
            end
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            local to_full
            do -- cdiv
              local a, b = q[4] - have, q[3]
              to_full = (a + (-a) % b) / b
            end
            repeat -- store
              local value, expires_at = format(q.f2, have, last), last + to_full
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_100 = expires_at
                  local at = expires_at_100
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    block = block_in_value,
    load = load,
    tokens = tokens,
    lag = lag,
    evaluate = evaluate,
    -- No more tokens than a bucket with room for the refill until the lease's end.
    lease_state = function(self, p, st, now, lease_end, into)
      local tokens = self.tokens(p, st, now)
      local cap = p[4] - fill(p, 0, lease_end - now)
      if tokens > cap then
        tokens = cap
      end
      into[1], into[2] = tokens, last_after(st, now)
      return into
    end,
    -- Twin of `TokenBucket::convert`: the tokens missing now (and owed, ahead of now)
    -- re-counted in the new unit; more than the capacity is owed as time ahead.
    convert = function(self, key, q, p, st, now, keep, since)
      local tokens = st[1]
      if tokens > q[4] then
        tokens = q[4]
      end
      local missing
      if st[2] > now then
        missing = q[4] - tokens + (st[2] - now) * q[3]
      else
        missing = q[4] - self.tokens(q, st, now)
        if missing < 0 then
          missing = 0
        end
      end
      if missing == 0 then
        return false
      end
      missing = rescale(missing, q[2], p[2])
      local last = now
      tokens = p[4] - missing
      if tokens < 0 then
        last = now + cdiv(-tokens, p[3])
        tokens = 0
      end
      store(key, p, format(p.f2, tokens, last), last + cdiv(p[4] - tokens, p[3]), keep, since)
      return true
    end,
    release = bucket_release,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local tokens = self.tokens(p, st, now)
      if units >= p[1] then
        tokens = p[4]
      else
        tokens = tokens + units * p[2]
        if tokens > p[4] then
          tokens = p[4]
        end
      end
      local last = last_after(st, now)
      store(key, p, format(p.f2, tokens, last), last + cdiv(p[4] - tokens, p[3]), keep, since)
    end,
    -- Twin of `TokenBucket::debit`: what the bucket lacks is owed as time ahead.
    debit = function(self, key, p, st, now, units, keep, since)
      local have = self.tokens(p, st, now) - units * p[2]
      local last = last_after(st, now)
      if have < 0 then
        last = last + cdiv(-have, p[3])
        have = 0
      end
      store(key, p, format(p.f2, have, last), last + cdiv(p[4] - have, p[3]), keep, since)
    end,
    commit = commit,
  }
end
-- Leaky bucket (meter): twin of leaky_bucket.rs. Params: capacity, unit, rate, full.
-- State: "level last" (level in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[5] = function()
  --@inline
  local load = read2

  --@inline
  local lag = bucket_lag

  -- The level of the bucket now.
  --@inline
  local function level(p, st, now)
    if not st then
      return 0
    end
    local elapsed = now - st[2]
    if elapsed < 0 then
      elapsed = 0
    end
    local to_empty = cdiv(st[1], p[3])
    if elapsed >= to_empty then
      return 0
    end
    return st[1] - elapsed * p[3]
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
    local now_level = level(p, st, now)
    local room = full - now_level
    if room < 0 then
      room = 0
    end
    local after = now_level + cost * unit
    if cost <= capacity and after <= full then
      local left = fdiv(full - after, unit)
      local reset = cdiv(after, rate)
      return 1, left, reset, -1
    end
    -- Denied: the room left now, and when the bucket is empty.
    local left = fdiv(room, unit)
    local reset = cdiv(now_level, rate)
    if cost > capacity then
      return 0, left, reset, -1
    end
    local retry = cdiv(after - full, rate)
    return 0, left, reset, retry
  end

  --@inline
  local function commit(self, key, p, st, now, cost, keep, since)
    local after = level(p, st, now)
    after = after + cost * p[2]
    local last = last_after(st, now)
    local to_empty = cdiv(after, p[3])
    store(key, p, format(p.f2, after, last), last + to_empty, keep, since)
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local now_level
      repeat -- level
        if not st then
          now_level = 0 break
        end
        local elapsed = now - st[2]
        if elapsed < 0 then
          elapsed = 0
        end
        local to_empty
        do -- cdiv
          local a, b = st[1], p[3]
          to_empty = (a + (-a) % b) / b
        end
        if elapsed >= to_empty then
          now_level = 0 break
        end
        now_level = st[1] - elapsed * p[3] break
      until true
      local room = full - now_level
      if room < 0 then
        room = 0
      end
      local after = now_level + cost * unit
      if cost <= capacity and after <= full then
        local left
        do -- fdiv
          local a = full - after
          left = (a - a % unit) / unit
        end
        local reset_1
        do -- cdiv
          reset_1 = (after + (-after) % rate) / rate
        end
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, reset_1, -1 break
      end
      local left
      do -- fdiv
        left = (room - room % unit) / unit
      end
      local reset_1
      do -- cdiv
        reset_1 = (now_level + (-now_level) % rate) / rate
      end
      if cost > capacity then
        ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_1, -1 break
      end
      local retry_1
      do -- cdiv
        local a = after - full
        retry_1 = (a + (-a) % rate) / rate
      end
      ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_1, retry_1 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local ok_11, remaining_11, reset_11, retry_11 = ok, remaining, reset, retry
        if behind > 0 then
          remaining_11 = 0
          reset_11 = reset_11 + behind
          if retry_11 >= 0 then
            retry_11 = retry_11 + behind
          end
          if ok_11 == 1 and cost > 0 then
            ok_11, retry_11 = 0, behind
            if reset_11 < behind then
              reset_11 = behind
            end
          end
        end
        ok, remaining, reset, retry = ok_11, remaining_11, reset_11, retry_11
      end
    end
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[i]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          repeat -- evaluate
            local capacity, unit, rate, full = q[1], q[2], q[3], q[4]
            local now_level
            repeat -- level
              if not st then
                now_level = 0 break
              end
              local elapsed = now - st[2]
              if elapsed < 0 then
                elapsed = 0
              end
              local to_empty
              do -- cdiv
                local a, b = st[1], q[3]
                to_empty = (a + (-a) % b) / b
              end
              if elapsed >= to_empty then
                now_level = 0 break
              end
              now_level = st[1] - elapsed * q[3] break
            until true
            local room = full - now_level
            if room < 0 then
              room = 0
            end
            local after = now_level + cost * unit
            if cost <= capacity and after <= full then
              local left
              do -- fdiv
                local a = full - after
                left = (a - a % unit) / unit
              end
              local reset_39
              do -- cdiv
                reset_39 = (after + (-after) % rate) / rate
              end
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, reset_39, -1 break
            end
            local left
            do -- fdiv
              left = (room - room % unit) / unit
            end
            local reset_39
            do -- cdiv
              reset_39 = (now_level + (-now_level) % rate) / rate
            end
            if cost > capacity then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_39, -1 break
            end
            local retry_39
            do -- cdiv
              local a = after - full
              retry_39 = (a + (-a) % rate) / rate
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_39, retry_39 break
          until true
          local behind
          do -- bucket_lag
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            behind = last - now
          end
          if behind > 0 then
            do -- shift
              local ok_49, remaining_49, reset_49, retry_49 = ok, remaining, reset, retry
              if behind > 0 then
                remaining_49 = 0
                reset_49 = reset_49 + behind
                if retry_49 >= 0 then
                  retry_49 = retry_49 + behind
                end
                if ok_49 == 1 and cost > 0 then
                  ok_49, retry_49 = 0, behind
                  if reset_49 < behind then
                    reset_49 = behind
                  end
                end
              end
              ok, remaining, reset, retry = ok_49, remaining_49, reset_49, retry_49
            end
          end
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_50 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_50 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_50 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            local after
            repeat -- level
              if not st then
                after = 0 break
              end
              local elapsed = now - st[2]
              if elapsed < 0 then
                elapsed = 0
              end
              local to_empty
              do -- cdiv
                local a, b = st[1], q[3]
                to_empty = (a + (-a) % b) / b
              end
              if elapsed >= to_empty then
                after = 0 break
              end
              after = st[1] - elapsed * q[3] break
            until true
            after = after + cost * q[2]
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            local to_empty
            do -- cdiv
              local b = q[3]
              to_empty = (after + (-after) % b) / b
            end
            repeat -- store
              local value, expires_at = format(q.f2, after, last), last + to_empty
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_58 = expires_at
                  local at = expires_at_58
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_50 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_50) break
      end
      total = total_50 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      do -- read2
        local into = STATES[1]
        local raw = call('GET', key)
        if raw then
          local a, b, written = match(raw, '^(%d+) (%d+)~([^|]*)$')
          if written ~= p.tag then
            a = nil
          end
          if not a then
            local state
            state, stale, ends = split_state(raw)
            if stale == p.tag then
              stale = nil
            end
            a, b = match(state or '', '^(%d+) (%d+)$')
          end
          st = false
          if a then
            into[1], into[2] = a + 0, b + 0
            st = into
          end
        end
      end
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        repeat -- evaluate
          local capacity, unit, rate, full = q[1], q[2], q[3], q[4]
          local now_level
          repeat -- level
            if not st then
              now_level = 0 break
            end
            local elapsed = now - st[2]
            if elapsed < 0 then
              elapsed = 0
            end
            local to_empty
            do -- cdiv
              local a, b = st[1], q[3]
              to_empty = (a + (-a) % b) / b
            end
            if elapsed >= to_empty then
              now_level = 0 break
            end
            now_level = st[1] - elapsed * q[3] break
          until true
          local room = full - now_level
          if room < 0 then
            room = 0
          end
          local after = now_level + cost * unit
          if cost <= capacity and after <= full then
            local left
            do -- fdiv
              local a = full - after
              left = (a - a % unit) / unit
            end
            local reset_67
            do -- cdiv
              reset_67 = (after + (-after) % rate) / rate
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, reset_67, -1 break
          end
          local left
          do -- fdiv
            left = (room - room % unit) / unit
          end
          local reset_67
          do -- cdiv
            reset_67 = (now_level + (-now_level) % rate) / rate
          end
          if cost > capacity then
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_67, -1 break
          end
          local retry_67
          do -- cdiv
            local a = after - full
            retry_67 = (a + (-a) % rate) / rate
          end
          ok, remaining, reset, retry, seen1, seen2, seen3 = 0, left, reset_67, retry_67 break
        until true
        local behind
        do -- bucket_lag
          local last
          repeat -- last_after
            if st and st[2] > now then
              last = st[2] break
            end
            last = now break
          until true
          behind = last - now
        end
        if behind > 0 then
          do -- shift
            local ok_77, remaining_77, reset_77, retry_77 = ok, remaining, reset, retry
            if behind > 0 then
              remaining_77 = 0
              reset_77 = reset_77 + behind
              if retry_77 >= 0 then
                retry_77 = retry_77 + behind
              end
              if ok_77 == 1 and cost > 0 then
                ok_77, retry_77 = 0, behind
                if reset_77 < behind then
                  reset_77 = behind
                end
              end
            end
            ok, remaining, reset, retry = ok_77, remaining_77, reset_77, retry_77
          end
        end
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            local after
            repeat -- level
              if not st then
                after = 0 break
              end
              local elapsed = now - st[2]
              if elapsed < 0 then
                elapsed = 0
              end
              local to_empty
              do -- cdiv
                local a, b = st[1], q[3]
                to_empty = (a + (-a) % b) / b
              end
              if elapsed >= to_empty then
                after = 0 break
              end
              after = st[1] - elapsed * q[3] break
            until true
            after = after + cost * q[2]
            local last
            repeat -- last_after
              if st and st[2] > now then
                last = st[2] break
              end
              last = now break
            until true
            local to_empty
            do -- cdiv
              local b = q[3]
              to_empty = (after + (-after) % b) / b
            end
            repeat -- store
              local value, expires_at = format(q.f2, after, last), last + to_empty
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_86 = expires_at
                  local at = expires_at_86
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    block = block_in_value,
    load = load,
    level = level,
    lag = lag,
    evaluate = evaluate,
    -- A level no lower than what drains until the lease's end.
    lease_state = function(self, p, st, now, lease_end, into)
      local level = self.level(p, st, now)
      local full, rate, d = p[4], p[3], lease_end - now
      local drain = full
      if d < cdiv(full, rate) then
        drain = d * rate
      end
      if level < drain then
        level = drain
      end
      into[1], into[2] = level, last_after(st, now)
      return into
    end,
    -- Twin of `LeakyBucket::convert`: the level now (and the drain owed, ahead of now)
    -- re-counted in the new unit.
    convert = function(self, key, q, p, st, now, keep, since)
      local level
      if st[2] > now then
        level = st[1] + (st[2] - now) * q[3]
      else
        level = self.level(q, st, now)
      end
      if level == 0 then
        return false
      end
      level = rescale(level, q[2], p[2])
      store(key, p, format(p.f2, level, now), now + cdiv(level, p[3]), keep, since)
      return true
    end,
    release = bucket_release,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local level = self.level(p, st, now)
      if units >= p[1] then
        level = 0
      else
        level = level - units * p[2]
        if level < 0 then
          level = 0
        end
      end
      local last = last_after(st, now)
      store(key, p, format(p.f2, level, last), last + cdiv(level, p[3]), keep, since)
    end,
    commit = commit,
  }
end
-- GCRA: twin of gcra.rs. Params: interval, tolerance (burst · interval, so a cost above the
-- burst is one whose cost · interval exceeds it). State: "tat" (a number, not a table).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[6] = function()
  --@inline
  local load = read1

  --@inline
  local function evaluate(self, p, st, now, cost)
    local interval, tolerance = p[1], p[2]
    local tat = now
    if st and st > now then
      tat = st
    end
    local backlog = tat - now
    local new_backlog = backlog + cost * interval
    if new_backlog <= tolerance then
      local left = fdiv(tolerance - new_backlog, interval)
      return 1, left, new_backlog, -1
    end
    local capped = backlog
    if capped > tolerance then
      capped = tolerance
    end
    local remaining_now = fdiv(tolerance - capped, interval)
    if cost * interval > tolerance then
      return 0, remaining_now, backlog, -1
    end
    return 0, remaining_now, backlog, new_backlog - tolerance
  end

  --@inline
  local function commit(self, key, p, st, now, cost, keep, since)
    local tat = now
    if st and st > now then
      tat = st
    end
    tat = tat + cost * p[1]
    store(key, p, format(p.f1, tat), tat, keep, since)
  end

  -- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
  -- phase one for each policy of a call, then phase two for each (`phases`), and a policy
  -- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
  -- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
  -- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
  -- commands. An operation
  -- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
  -- grant.lua once its state is read; every operation is charged, or reported as it stays,
  -- here.
  
  -- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
  -- remaining and reset; a blocked key is denied until the block ends, whatever its state
  -- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
  -- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
  --@inline
  local function verdict(self, p, st, ends, now, cost, key)
    local ok, remaining, reset, retry, seen1, seen2, seen3
    repeat -- evaluate
      local interval, tolerance = p[1], p[2]
      local tat = now
      if st and st > now then
        tat = st
      end
      local backlog = tat - now
      local new_backlog = backlog + cost * interval
      if new_backlog <= tolerance then
        local left
        do -- fdiv
          local a = tolerance - new_backlog
          left = (a - a % interval) / interval
        end
        ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, new_backlog, -1 break
      end
      local capped = backlog
      if capped > tolerance then
        capped = tolerance
      end
      local remaining_now
      do -- fdiv
        local a = tolerance - capped
        remaining_now = (a - a % interval) / interval
      end
      if cost * interval > tolerance then
        ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, -1 break
      end
      ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, new_backlog - tolerance break
    until true
    if ends and ends > now then
      local wait = ends - now
      if ok == 1 or retry >= 0 then
        if retry < wait then
          retry = wait
        end
      end
      ok = 0
      remaining = 0
      if reset < wait then
        reset = wait
      end
    end
    local v = retry
    if ok == 1 then
      v = -2
    elseif retry < 0 then
      v = -1
    end
    return v, remaining, reset, seen1, seen2, seen3
  end
  
  
  
  
  -- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
  -- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
  -- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
  -- it, each one call deeper; then phase two for policy i, once the request is known to be
  -- admitted or not (by every policy that decides), so what each phase hands the other stays
  -- in locals. Phase two runs from the last policy to the first: each has its own key.
  -- Returns whether the request is admitted, where the reply of the checks ends, and whether
  -- a key was decided under its own limit (then PS[i] holds the parameters of each policy
  -- from i on as it was decided).
  local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- read1
        local raw = call('GET', key)
        if not raw then
          st, ends, stale = nil break
        end
        local bare
        repeat -- untagged
          local tag = p.tag
          if find(raw, tag, #raw - #tag + 1, true) then
            bare = sub(raw, 1, #raw - #tag) break
          end
          bare = nil break
        until true
        if bare then
          local n = tonumber(bare)
          if n then
            st, ends, stale = n break
          end
        end
        local state, tag, ends_17 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        st, ends, stale = tonumber(state) or false, ends_17, tag break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
      end
      q = p
    end
    local fused = FUSES[op]
    local ok, seen1, seen2, seen3, lease_end, wait
    if fused then
      do -- phase_one
        local v, remaining, reset
        do -- verdict
          local ok, retry
          repeat -- evaluate
            local interval, tolerance = q[1], q[2]
            local tat = now
            if st and st > now then
              tat = st
            end
            local backlog = tat - now
            local new_backlog = backlog + cost * interval
            if new_backlog <= tolerance then
              local left
              do -- fdiv
                local a = tolerance - new_backlog
                left = (a - a % interval) / interval
              end
              ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, new_backlog, -1 break
            end
            local capped = backlog
            if capped > tolerance then
              capped = tolerance
            end
            local remaining_now
            do -- fdiv
              local a = tolerance - capped
              remaining_now = (a - a % interval) / interval
            end
            if cost * interval > tolerance then
              ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, -1 break
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, new_backlog - tolerance break
          until true
          if ends and ends > now then
            local wait = ends - now
            if ok == 1 or retry >= 0 then
              if retry < wait then
                retry = wait
              end
            end
            ok = 0
            remaining = 0
            if reset < wait then
              reset = wait
            end
          end
          v = retry
          if ok == 1 then
            v = -2
          elseif retry < 0 then
            v = -1
          end
        end
        REPLY[base + 1] = v
        REPLY[base + 2] = remaining
        REPLY[base + 3] = reset
        ok = v == -2
      end
    else
      ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
    end
    if not ok and DECIDES[op] then
      admitted = false
    end
    local total, own = base + WIDTH[op], false
    if i < n then
      local j = i + 1
      admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
    end
    repeat -- phase_two
      local e, total_24 = p.escalate, total
      if admitted then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, base, since)
          total = total_24 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[i], lease_end, base, since)
          total = total_24 break
        end
        if cost > 0 and (fused or charged(op, base)) then
          repeat -- commit
            local tat = now
            if st and st > now then
              tat = st
            end
            tat = tat + cost * q[1]
            repeat -- store
              local value, expires_at = format(q.f1, tat), tat
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_28 = expires_at
                  local at = expires_at_28
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if op == 4 then
            REPLY[base + 4], REPLY[base + 5] = cost, now
          end
          total = total_24 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, base)
      if e and fused and not admitted then
        total = strike(self, key, q, e, ends, now, since, base, i, total_24) break
      end
      total = total_24 break
    until true
    if q ~= p then
      PS[i], own = q, true
    end
    return admitted, total, own
  end
  
  -- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
  -- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
  -- runs them; written here again, inlined, because this call is the most usual). Returns the
  -- reply; nil, having done nothing, when the arguments are malformed.
  local function enforced(self, key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      if not cost then
        return nil
      end
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      p = TAGGED[tag]
      if not p and tag then
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
    end
    if not p then
      return nil
    end
    local now, since
    do -- clock
      local injected = shape >= 2048
      if injected then
        now = tonumber(args[#args - 1])
        since = now - 1000 * tonumber(args[#args])
      else
        local t = call('TIME')
        now = t[1] * 1000000 + t[2]
        since = now
      end
    end
    local st, ends, q
    do -- loaded
      local p = p
      local stale
      repeat -- read1
        local raw = call('GET', key)
        if not raw then
          st, ends, stale = nil break
        end
        local bare
        repeat -- untagged
          local tag = p.tag
          if find(raw, tag, #raw - #tag + 1, true) then
            bare = sub(raw, 1, #raw - #tag) break
          end
          bare = nil break
        until true
        if bare then
          local n = tonumber(bare)
          if n then
            st, ends, stale = n break
          end
        end
        local state, tag, ends_34 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        st, ends, stale = tonumber(state) or false, ends_34, tag break
      until true
      if stale then
        st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[1], since)
      end
      q = p
    end
    local ok, seen1, seen2, seen3
    do -- phase_one
      local v, remaining, reset
      do -- verdict
        local ok, retry
        repeat -- evaluate
          local interval, tolerance = q[1], q[2]
          local tat = now
          if st and st > now then
            tat = st
          end
          local backlog = tat - now
          local new_backlog = backlog + cost * interval
          if new_backlog <= tolerance then
            local left
            do -- fdiv
              local a = tolerance - new_backlog
              left = (a - a % interval) / interval
            end
            ok, remaining, reset, retry, seen1, seen2, seen3 = 1, left, new_backlog, -1 break
          end
          local capped = backlog
          if capped > tolerance then
            capped = tolerance
          end
          local remaining_now
          do -- fdiv
            local a = tolerance - capped
            remaining_now = (a - a % interval) / interval
          end
          if cost * interval > tolerance then
            ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, -1 break
          end
          ok, remaining, reset, retry, seen1, seen2, seen3 = 0, remaining_now, backlog, new_backlog - tolerance break
        until true
        if ends and ends > now then
          local wait = ends - now
          if ok == 1 or retry >= 0 then
            if retry < wait then
              retry = wait
            end
          end
          ok = 0
          remaining = 0
          if reset < wait then
            reset = wait
          end
        end
        v = retry
        if ok == 1 then
          v = -2
        elseif retry < 0 then
          v = -1
        end
      end
      REPLY[0 + 1] = v
      REPLY[0 + 2] = remaining
      REPLY[0 + 3] = reset
      ok = v == -2
    end
    REPLY[3 + 1] = nil
    local total
    repeat -- phase_two
      local fused, lease_end, wait, e = true, nil, nil, p.escalate
      if ok then
        if wait then
          book(self, key, q, st, ends, now, cost, wait, 0, since)
          total = 3 break
        end
        if lease_end then
          take_lease(self, key, q, st, ends, now, cost, YS[1], lease_end, 0, since)
          total = 3 break
        end
        if cost > 0 and (fused or charged(1, 0)) then
          repeat -- commit
            local tat = now
            if st and st > now then
              tat = st
            end
            tat = tat + cost * q[1]
            repeat -- store
              local value, expires_at = format(q.f1, tat), tat
              if q.limit_end and q.limit_end > expires_at then
                expires_at = q.limit_end
              end
              if ends then
                local block_end
                do -- int
                  block_end = format(INT, ends)
                end
                value = value .. '|' .. block_end
                do -- until_block_ends
                  local expires_at_45 = expires_at
                  local at = expires_at_45
                  if ends and ends > at then
                    at = ends
                  end
                  expires_at = at
                end
              end
              local ms
              do -- ttl_ms
                do -- cdiv
                  local a = expires_at - since
                  ms = (a + (-a) % 1000) / 1000
                end
                if ms < 1 then
                  ms = 1
                end
              end
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          until true
          if 1 == 4 then
            REPLY[0 + 4], REPLY[0 + 5] = cost, now
          end
          total = 3 break
        end
      end
      uncharged(self, key, q, st, ends, now, since, cost, 0)
      if e and fused and not ok then
        total = strike(self, key, q, e, ends, now, since, 0, 1, 3) break
      end
      total = 3 break
    until true
    if q ~= p then
      PS[1] = q
      own_limits(1, total)
    end
    return REPLY
  end
  return {
    verdict = verdict,
    phases = phases,
    enforced = enforced,
    block = block_in_value,
    load = load,
    evaluate = evaluate,
    -- The TAT no earlier than the lease's end: the units are charged as if spent then.
    lease_state = function(self, p, st, now, lease_end)
      local tat = now
      if st and st > now then
        tat = st
      end
      if lease_end > tat then
        tat = lease_end
      end
      return tat
    end,
    -- Twin of `Gcra::convert`: the backlog re-counted in the new interval.
    convert = function(self, key, q, p, st, now, keep, since)
      if not st or st <= now then
        return false
      end
      local tat = now + rescale(st - now, q[1], p[1])
      store(key, p, format(p.f1, tat), tat, keep, since)
      return true
    end,
    -- Gives back the latest booked time only: its charge put the TAT at `at + tolerance`.
    release = function(self, key, p, st, now, at, units, keep, since)
      if st and st == at + p[2] then
        self:refund(key, p, st, now, units, keep, since)
      end
    end,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local tat = st
      if tat < now then
        tat = now
      end
      tat = tat - units * p[1]
      if tat < now then
        tat = now
      end
      store(key, p, format(p.f1, tat), tat, keep, since)
    end,
    commit = commit,
  }
end
-- Decides one request against one or more policies, atomically.
-- KEYS[i]: the state key of policy i (all in one hash slot).
-- ARGV: for each policy, its shape, then its cost when the shape says one follows, then the
-- ARGS[op] integers of its operation, then its tag (its algorithm and parameters: see
-- `read_params` and `store`); after the last
-- policy, when the first shape says the time is injected, the time in microseconds and the
-- milliseconds added to every TTL (Redis expires keys on its own clock, which an injected
-- clock may outrun or lag: `clock` gives the time TTLs count from). Otherwise the time is
-- Redis TIME.
-- A shape is one integer: algorithm + MODE_UNIT * operation, plus COST_FLAG when a cost other
-- than 1 follows and CLOCK_FLAG when the time is injected. The first shape may carry
-- LISTED_FLAG: the last key is the record of the key's runtime list entries, which sends no
-- argument and is read before any policy (`listing`); a call of the record alone sends that
-- flag (with CLOCK_FLAG when the time is injected) as its only shape.
-- The algorithm ids, the operations and each operation's facts are generated from Rust
-- (`Algorithm`, and `Op` in `store/op.rs`, which says what each operation is): the tables
-- DECIDES (a denial denies the request), CHARGES (0: never charged here; 1: when its own
-- verdict admits; 2: always, if the request is admitted), ACTS (changes the state on its own,
-- then looks at cost 0: its arm is ACT[op] in act.lua), ARGS (its integers), GRANTS (its reply
-- has the three integers of a grant), KEEPS (judged as if its integer more units were asked
-- for, charged its cost: RESERVE) and FUSES (decided by the phases themselves, phases.lua,
-- with no arm of its own: ENFORCE).
-- The operations' own arms are in act.lua and grant.lua, nowhere else: ACT[op] for those that
-- act;
-- LEASE (decided on the state as strict as a lease could make it, `lease_state`, and charged
-- a lease of what is left instead of its cost, `take_lease`), WAIT (a request it denies now
-- is admitted when a wait of at most its integer would admit it, `booking` and
-- `book`), CONCURRENCY (its grant is the slots charged and the time they were charged at).
-- A blocked key is denied whatever its state, until the block ends; the block is kept in the
-- state key itself (see `read` and the sliding log), so a decision finds it with the read it
-- makes anyway, and stays on record while the key lives (a clock that goes back finds it
-- again, as the memory store does).
-- Every operation that acts does so first, in order; then phase one for each policy, then
-- phase two for each (`phases`, in phases.lua), charged only if all that decide admit. A
-- policy enforced alone, the usual call, is its twin's `enforced`: the same two phases.
-- Reply: {LISTED_DENY, microseconds left} or {LISTED_ALLOW, 0} when the record says the key
-- is on a list (no policy decided); else CHECK_WIDTH integers per policy, each at its place
-- (`at` in script.rs, AT_... here): the verdict (ADMITTED, or the retry-after in
-- microseconds, or NEVER when no wait admits it), remaining, reset_after_us; remaining and
-- reset describe the state after this request's charges. A granting operation's reply has REPLY_GRANT more: the units granted (0 when none),
-- the grant's end (a lease's end, a booked time, the time held slots were charged at), and
-- the microseconds until then.

-- Each algorithm's functions, built the first time a decision uses it: once per call when
-- this runs as a script (which runs whole on every call), once per load as a function.
local BUILT = {}
local function algorithm(id)
  local alg = BUILT[id]
  if not alg then
    local make = ALG[id]
    if not make then
      return nil
    end
    alg = make()
    BUILT[id] = alg
  end
  return alg
end

-- The policy whose shape is at args[at], the i-th of the call: its algorithm, operation,
-- parameters (`read_params`), cost and the operation's integers; where the next policy starts
-- and whether the time is injected. Nil when malformed.
--@inline
local function read_policy(args, at, i)
  local shape = SHAPES[args[at]] or read_shape(args[at])
  if not shape then
    return nil
  end
  local id = shape % 32
  local alg = BUILT[id] or algorithm(id)
  local op = (shape % 1024 - id) / 32
  if not alg or not ARGS[op] then
    return nil
  end
  local cost = 1
  at = at + 1
  if shape % 2048 >= 1024 then
    cost = tonumber(args[at])
    at = at + 1
  end
  local count, x, y = ARGS[op], nil, nil
  if count > 0 then
    x = tonumber(args[at])
    if count > 1 then
      y = tonumber(args[at + 1])
    end
    at = at + count
  end
  if not STATES[i] then
    STATES[i], LEASED[i] = {}, {}
  end
  local p
  do -- read_params
    local tag = args[at]
    p = TAGGED[tag]
    if not p and tag then
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
  end
  if not p then
    return nil
  end
  return alg, op, p, cost, x, y, at + 1, shape >= 2048
end

-- The algorithm of each shape whose operation the phases decide themselves (`FUSES`), false
-- for a shape whose operation they do not (`enforced_by`).
local ENFORCED = {}

-- The algorithm of a policy of this shape, remembered, when the phases decide its
-- operation, else false.
local function enforced_by(shape)
  local id = shape % 32
  local alg = false
  if FUSES[(shape % 1024 - id) / 32] then
    alg = algorithm(id) or false
  end
  ENFORCED[shape] = alg
  return alg
end


-- Every policy of the call read into the tables (ALGS, OPS, PS, COSTS, XS, YS), all before
-- anything is done: the place of the first malformed one, or nil, whether the first
-- policy's clock is injected and whether one acts.
local function read_all(args, n)
  local at, injected, acts = 1, false, false
  for i = 1, n do
    local alg, op, p, cost, x, y, next_at, clock_flag
    repeat -- read_policy
      local at = at
      local shape = SHAPES[args[at]] or read_shape(args[at])
      if not shape then
        alg, op, p, cost, x, y, next_at, clock_flag = nil break
      end
      local id = shape % 32
      local alg_2 = BUILT[id] or algorithm(id)
      local op_2 = (shape % 1024 - id) / 32
      if not alg_2 or not ARGS[op_2] then
        alg, op, p, cost, x, y, next_at, clock_flag = nil break
      end
      local cost_2 = 1
      at = at + 1
      if shape % 2048 >= 1024 then
        cost_2 = tonumber(args[at])
        at = at + 1
      end
      local count, x_2, y_2 = ARGS[op_2], nil, nil
      if count > 0 then
        x_2 = tonumber(args[at])
        if count > 1 then
          y_2 = tonumber(args[at + 1])
        end
        at = at + count
      end
      if not STATES[i] then
        STATES[i], LEASED[i] = {}, {}
      end
      local p_2
      do -- read_params
        local tag = args[at]
        p_2 = TAGGED[tag]
        if not p_2 and tag then
          local bang = find(tag, '!', 1, true)
          local rest = bang and sub(tag, 1, bang - 1) or tag
          local semi = find(rest, ';', 1, true)
          p_2 = { tag = semi and sub(rest, 1, semi - 1) or rest }
          local escalate = bang and {}
          if not tag_params(rest, p_2) or (bang and not tag_params('Q' .. sub(tag, bang + 1), escalate)) then
            p_2 = nil
          else
            p_2.escalate = escalate
            remember(tag, p_2)
          end
        end
      end
      if not p_2 then
        alg, op, p, cost, x, y, next_at, clock_flag = nil break
      end
      alg, op, p, cost, x, y, next_at, clock_flag = alg_2, op_2, p_2, cost_2, x_2, y_2, at + 1, shape >= 2048 break
    until true
    if not alg then
      return at
    end
    ALGS[i], OPS[i], PS[i], COSTS[i], at = alg, op, p, cost, next_at
    if x then
      -- Read only by the operations that have them.
      XS[i], YS[i] = x, y
    end
    if i == 1 then
      injected = clock_flag
    end
    if ACTS[op] then
      acts = true
    end
  end
  return nil, injected, acts
end

-- The first shape sent as a string flagged with LISTED_FLAG, the same shape unflagged.
local UNFLAGGED = {}

-- The first policy's shape, and whether the call's last key is the record of the key's
-- runtime list entries (the first shape flagged with LISTED_FLAG, which is taken off
-- `args[1]` here, so nothing after this reads it). Nil when malformed.
--@inline
local function first_shape(args)
  local s = args[1]
  local shape = SHAPES[s]
  if shape then
    return shape, false
  end
  local plain = UNFLAGGED[s]
  if not plain then
    shape = read_shape(s)
    if not shape or shape < 4096 or shape >= 4096 + 2 * 2048 then
      return shape, false
    end
    plain = tostring(shape - 4096)
    UNFLAGGED[s] = plain
  end
  args[1] = plain
  return SHAPES[plain] or read_shape(plain), true
end

-- What the record of the key's runtime list entries says (`key`: `<deny end> <allow end>`,
-- in microseconds, 0 for none; written by lists.lua, gone when both ended): the reply to a
-- key on a list (the deny list first), else nil (no record: the usual case, one GET).
--@inline
local function listing(key, args, shape)
  local record = call('GET', key)
  if not record then
    return nil
  end
  local deny, allow = match(record, '^(%d+) (%d+)$')
  if not deny then
    return nil
  end
  local now
  do -- clock
    local injected = shape >= 2048
    local now_4, since
    if injected then
      now_4 = tonumber(args[#args - 1])
      since = now_4 - 1000 * tonumber(args[#args])
    else
      local t = call('TIME')
      now_4 = t[1] * 1000000 + t[2]
      since = now_4
    end
    now = now_4, since
  end
  if tonumber(deny) > now then
    return { 1, tonumber(deny) - now }
  end
  if tonumber(allow) > now then
    return { 2, 0 }
  end
  return nil
end

local function malformed(args, at)
  return redis.error_reply('tower-ratelimit: malformed policy ' .. tostring(args[at]))
end

-- The decision: each policy read (all before anything is done: a malformed call changes
-- nothing), the time read; every act, in order; then `phases` from the first policy (phase one
-- for each, then phase two for each, charged only if every policy that decides admits). A
-- policy enforced alone, the usual call, is its twin's `enforced`, which reads its own
-- arguments (nil when they are malformed: they are then read here, and refused).
local function decide(keys, args)
  if not format then
    bind_libraries()
  end
  local n = #keys
  local shape, listed
  repeat -- first_shape
    local s = args[1]
    local shape_5 = SHAPES[s]
    if shape_5 then
      shape, listed = shape_5, false break
    end
    local plain = UNFLAGGED[s]
    if not plain then
      shape_5 = read_shape(s)
      if not shape_5 or shape_5 < 4096 or shape_5 >= 4096 + 2 * 2048 then
        shape, listed = shape_5, false break
      end
      plain = tostring(shape_5 - 4096)
      UNFLAGGED[s] = plain
    end
    args[1] = plain
    shape, listed = SHAPES[plain] or read_shape(plain), true break
  until true
  if listed then
    local said
    repeat -- listing
      local key = keys[n]
      local record = call('GET', key)
      if not record then
        said = nil break
      end
      local deny, allow = match(record, '^(%d+) (%d+)$')
      if not deny then
        said = nil break
      end
      local now
      do -- clock
        local injected = shape >= 2048
        local now_7, since
        if injected then
          now_7 = tonumber(args[#args - 1])
          since = now_7 - 1000 * tonumber(args[#args])
        else
          local t = call('TIME')
          now_7 = t[1] * 1000000 + t[2]
          since = now_7
        end
        now = now_7, since
      end
      if tonumber(deny) > now then
        said = { 1, tonumber(deny) - now } break
      end
      if tonumber(allow) > now then
        said = { 2, 0 } break
      end
      said = nil break
    until true
    n = n - 1
    if said or n == 0 then
      return said or {}
    end
  end
  if n == 1 then
    local alg = ENFORCED[shape]
    if alg == nil and shape then
      alg = enforced_by(shape)
    end
    if alg then
      local reply = alg:enforced(keys[1], args, shape)
      if reply then
        return reply
      end
    end
  end
  local bad, injected, acts = read_all(args, n)
  if bad then
    return malformed(args, bad)
  end
  local now, since
  do -- clock
    if injected then
      now = tonumber(args[#args - 1])
      since = now - 1000 * tonumber(args[#args])
    else
      local t = call('TIME')
      now = t[1] * 1000000 + t[2]
      since = now
    end
  end
  if acts then
    for i = 1, n do
      if ACTS[OPS[i]] then
        act(ALGS[i], OPS[i], keys[i], PS[i], now, COSTS[i], XS[i], STATES[i], since)
        COSTS[i] = 0
      end
    end
  end
  local _, total, own = ALGS[1]:phases(1, n, keys, now, since, true, 0, OPS[1], keys[1], COSTS[1], PS[1])
  if own then
    own_limits(n, total)
  else
    REPLY[total + 1] = nil
  end
  return REPLY
end

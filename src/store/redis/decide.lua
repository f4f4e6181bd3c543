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
  local id = shape % MODE_UNIT
  local alg = BUILT[id] or algorithm(id)
  local op = (shape % COST_FLAG - id) / MODE_UNIT
  if not alg or not ARGS[op] then
    return nil
  end
  local cost = 1
  at = at + 1
  if shape % CLOCK_FLAG >= COST_FLAG then
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
  local p = read_params(args[at])
  if not p then
    return nil
  end
  return alg, op, p, cost, x, y, at + 1, shape >= CLOCK_FLAG
end

-- The algorithm of each shape whose operation the phases decide themselves (`FUSES`), false
-- for a shape whose operation they do not (`enforced_by`).
local ENFORCED = {}

-- The algorithm of a policy of this shape, remembered, when the phases decide its
-- operation, else false.
local function enforced_by(shape)
  local id = shape % MODE_UNIT
  local alg = false
  if FUSES[(shape % COST_FLAG - id) / MODE_UNIT] then
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
    local alg, op, p, cost, x, y, next_at, clock_flag = read_policy(args, at, i)
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
    if not shape or shape < LISTED_FLAG or shape >= LISTED_FLAG + 2 * CLOCK_FLAG then
      return shape, false
    end
    plain = tostring(shape - LISTED_FLAG)
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
  local now = clock(args, shape >= CLOCK_FLAG)
  if tonumber(deny) > now then
    return { LISTED_DENY, tonumber(deny) - now }
  end
  if tonumber(allow) > now then
    return { LISTED_ALLOW, 0 }
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
  local shape, listed = first_shape(args)
  if listed then
    local said = listing(keys[n], args, shape)
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
  local now, since = clock(args, injected)
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

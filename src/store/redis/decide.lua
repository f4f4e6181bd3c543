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
-- LOOKS_FLAG: the call is one enforced policy and the lists' two looks at its key's runtime
-- entries (KEYS[2], KEYS[3]), whose arguments are not sent (`looks`); with no entry the
-- policy is decided alone, and the reply is its own.
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
-- Reply: CHECK_WIDTH integers per policy, each at its place (`at` in script.rs, AT_... here):
-- the verdict (ADMITTED, or the retry-after in microseconds, or NEVER when no wait admits it),
-- remaining, reset_after_us; remaining and reset describe the state after this request's
-- charges. A granting operation's reply has REPLY_GRANT more: the units granted (0 when none),
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

-- The first shape sent as a string flagged with LOOKS_FLAG, the same shape unflagged.
local UNFLAGGED = {}

-- The first policy's shape, and whether the call is one enforced policy then the lists'
-- two looks at its key's runtime entries (the first shape flagged with LOOKS_FLAG, which is
-- taken off `args[1]` here, so nothing after this reads it). Nil when malformed.
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
    if not shape or shape < LOOKS_FLAG or shape >= LOOKS_FLAG + 2 * CLOCK_FLAG then
      return shape, false
    end
    plain = tostring(shape - LOOKS_FLAG)
    UNFLAGGED[s] = plain
  end
  args[1] = plain
  return SHAPES[plain] or read_shape(plain), true
end

-- The lists' looks at a key's runtime entries (KEYS[2] and KEYS[3]), whose arguments are not
-- sent (the first shape's LOOKS_FLAG says they follow the policy, of shape `shape`). With
-- no entry (the usual case), they admit, charge nothing and keep nothing: returns true, and
-- the policy is decided alone, its reply alone (the caller knows what the looks say).
-- Else their arguments are written after the policy's (each the same: the entries' tier,
-- LOOK_TAG, looked at at cost 0), for them to be decided as any policy is; returns false.
--@inline
local function looks(keys, args, shape)
  if call('EXISTS', keys[2], keys[3]) == 0 then
    return true
  end
  local at, look = 3, LOOK_SHAPE
  if shape % CLOCK_FLAG >= COST_FLAG then
    at = 4
  end
  if shape >= CLOCK_FLAG then
    look = look + CLOCK_FLAG
  end
  look = tostring(look)
  for _ = 1, 2 do
    table.insert(args, at, LOOK_TAG)
    table.insert(args, at, '0')
    table.insert(args, at, look)
  end
  return false
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
  local shape, looked_at = first_shape(args)
  local alone = n == 1
  if looked_at then
    if n ~= 3 then
      return malformed(args, 1)
    end
    alone = looks(keys, args, shape)
  end
  if alone then
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

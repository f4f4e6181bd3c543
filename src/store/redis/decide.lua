-- Decides one request against one or more policies, atomically.
-- KEYS[2i-1], KEYS[2i]: the state key and the block key of policy i (one slot).
-- ARGV[1]: the time in microseconds, or '' to use Redis TIME.
-- ARGV[2]: milliseconds added to every TTL (0 unless the time is injected: Redis then expires
-- keys on its own clock, which an injected clock may outrun or lag).
-- Then ARGS_PER_POLICY arguments per policy: algorithm, four parameters, cost, mode. The algorithm ids and
-- the modes are the constants of the generated prelude (from `Algorithm` and `Mode` in Rust):
-- ENFORCE decides, and is charged only if every policy that decides admits the request;
-- SHADOW is reported, never decides, and is charged if it admits and the request goes on;
-- CHARGE_LATER decides and is never charged here (the charge comes after the response);
-- REFUND gives `cost` units back, RESET forgets the key and any block, PENALIZE charges `cost`
-- units whatever the state, BLOCK denies the key for the next `cost` microseconds; each of
-- these four then looks at cost 0. A blocked key is denied whatever its state, until the block
-- ends.
-- Phase one evaluates every policy; phase two charges them, only if all that decide admit.
-- Reply: { now, then REPLY_PER_POLICY integers per policy: allowed, remaining, reset_after_us,
-- retry_after_us or -1 },
-- where remaining and reset describe the state after this request's charges.

-- The clock-lag adjustment (twin of `evaluate_with_lag`), for the algorithms that keep their own
-- time (`alg.lag`): a state newer than `now` (the clock went back) decides as of its own time,
-- and its times are moved to be from `now`. Called only for those algorithms, so the others pay
-- nothing for it.
local function shift(alg, p, st, now, reset, retry)
  local lag = alg.lag(p, st, now)
  if lag > 0 then
    if reset > 0 then
      reset = reset + lag
    end
    if retry >= 0 then
      retry = retry + lag
    end
  end
  return reset, retry
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

TTL_SLACK = tonumber(ARGV[2]) or 0

local n = #KEYS / 2
local algs, params, costs, modes, states, allowed = {}, {}, {}, {}, {}, {}
local reply = { now }
local admitted = true
for i = 1, n do
  local base = 2 + (i - 1) * ARGS_PER_POLICY
  local make = ALG[tonumber(ARGV[base + 1])]
  if not make then
    return redis.error_reply('tower-ratelimit: unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local alg = make()
  local p = {
    tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]),
    tonumber(ARGV[base + 4]),
    tonumber(ARGV[base + 5]),
  }
  local cost = tonumber(ARGV[base + 6])
  local mode = tonumber(ARGV[base + 7])
  local key, bkey = KEYS[2 * i - 1], KEYS[2 * i]
  if mode == BLOCK then
    local ms = cdiv(cost, 1000)
    if ms < 1 then
      ms = 1
    end
    redis.call('SET', bkey, int(now + cost), 'PX', ms + TTL_SLACK)
    cost = 0
  elseif mode == RESET then
    redis.call('DEL', bkey)
  end
  local raw = redis.call('GET', bkey)
  local blocked = raw and tonumber(raw)
  local st = alg.load(key, p)
  if mode == REFUND then
    alg:refund(key, p, st, now, cost)
    st = alg.load(key, p)
    cost = 0
  elseif mode == RESET then
    redis.call('DEL', key)
    st = nil
    cost = 0
  elseif mode == PENALIZE then
    if cost > 0 then
      alg:commit(key, p, st, now, cost)
    end
    st = alg.load(key, p)
    cost = 0
  end
  local ok, remaining, reset, retry = alg:evaluate(p, st, now, cost, key)
  if alg.lag then
    reset, retry = shift(alg, p, st, now, reset, retry)
  end
  if blocked and blocked > now then
    -- Blocked: denied until the block ends, whatever the state (twin of `apply_block`).
    local wait = blocked - now
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
  if ok == 0 and (mode == ENFORCE or mode == CHARGE_LATER) then
    admitted = false
  end
  algs[i], params[i], costs[i], modes[i], states[i], allowed[i] = alg, p, cost, mode, st, ok
  reply[#reply + 1] = ok
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
end

for i = 1, n do
  local charge = admitted and costs[i] > 0 and (modes[i] == ENFORCE or (modes[i] == SHADOW and allowed[i] == 1))
  if charge then
    algs[i]:commit(KEYS[2 * i - 1], params[i], states[i], now, costs[i])
  elseif allowed[i] == 1 and costs[i] > 0 then
    -- Admitted by this policy but not charged: report the state as it stays.
    local base = 2 + (i - 1) * REPLY_PER_POLICY
    local _, remaining, reset, retry = algs[i]:evaluate(params[i], states[i], now, 0, KEYS[2 * i - 1])
    if algs[i].lag then
      reset = shift(algs[i], params[i], states[i], now, reset, retry)
    end
    reply[base + 1] = remaining
    reply[base + 2] = reset
  end
  if not charge and redis.call('PTTL', KEYS[2 * i - 1]) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    local ttl = cdiv(reply[2 + (i - 1) * REPLY_PER_POLICY + 2], 1000) + TTL_SLACK
    if ttl < 1 then
      ttl = 1
    end
    redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
  end
end

return reply

-- Token bucket: twin of token_bucket.rs. Params: capacity, unit, rate, full.
-- State: "tokens last" (tokens in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[TOKEN_BUCKET] = function()
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

  return {
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

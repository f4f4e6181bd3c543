-- Leaky bucket (meter): twin of leaky_bucket.rs. Params: capacity, unit, rate, full.
-- State: "level last" (level in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[LEAKY_BUCKET] = function()
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

  return {
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

-- Leaky bucket (meter): twin of leaky_bucket.rs. Params: capacity, unit, rate, full.
-- State: "level last" (level in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[LEAKY_BUCKET] = function()
  return {
    block = block_in_value,
    load = read2,
    level = function(p, st, now)
      if not st then
        return 0
      end
      local elapsed = now - st[2]
      if elapsed < 0 then
        elapsed = 0
      end
      if elapsed >= cdiv(st[1], p[3]) then
        return 0
      end
      return st[1] - elapsed * p[3]
    end,
    lag = bucket_lag,
    evaluate = function(self, p, st, now, cost)
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local level = self.level(p, st, now)
      local room = full - level
      if room < 0 then
        room = 0
      end
      if cost > capacity then
        return 0, fdiv(room, unit), cdiv(level, rate), -1
      end
      local after = level + cost * unit
      if after <= full then
        return 1, fdiv(full - after, unit), cdiv(after, rate), -1
      end
      return 0, fdiv(room, unit), cdiv(level, rate), cdiv(after - full, rate)
    end,
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
    convert = function(self, key, q, p, st, now)
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
      store(key, p, format(INT2, level, now), now, now + cdiv(level, p[3]))
      return true
    end,
    release = bucket_release,
    refund = function(self, key, p, st, now, units)
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
      store(key, p, format(INT2, level, last), now, last + cdiv(level, p[3]))
    end,
    commit = function(self, key, p, st, now, cost)
      local level = self.level(p, st, now) + cost * p[2]
      local last = last_after(st, now)
      store(key, p, format(INT2, level, last), now, last + cdiv(level, p[3]))
    end,
  }
end

-- Sliding log: twin of sliding_log.rs. Params: limit, window. State: a sorted set with one
-- member per admitted unit, scored by its time; members are "time:sequence", the sequence
-- zero-padded so that members of one time sort by it, and numbered on from the newest member
-- of that time (never reused while that member exists, even after a refund).
-- Built only when a decision uses it: the script runs whole on every call.
ALG[SLIDING_LOG] = function()
  return {
    load = function(key)
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if #newest == 0 then
        return nil
      end
      return { tonumber(newest[2]), newest[1] }
    end,
    -- Time as the log sees it: never before its newest entry.
    clamp = function(st, now)
      if st and st[1] > now then
        return st[1]
      end
      return now
    end,
    lag = function(p, st, now)
      if st and st[1] > now then
        return st[1] - now
      end
      return 0
    end,
    evaluate = function(self, p, st, now, cost, key)
      local limit, window = p[1], p[2]
      now = self.clamp(st, now)
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
      local expired = redis.call('ZCOUNT', key, '-inf', int(now - window))
      local used = redis.call('ZCARD', key) - expired
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
      local need = used + cost - limit
      local entry = redis.call('ZRANGE', key, expired + need - 1, expired + need - 1, 'WITHSCORES')
      return 0, left, newest_left, tonumber(entry[2]) + window - now
    end,
    refund = function(self, key, p, st, now, units)
      if st and units > 0 then
        -- The newest members have the highest scores.
        redis.call('ZPOPMAX', key, units)
      end
    end,
    commit = function(self, key, p, st, now, cost)
      local window = p[2]
      now = self.clamp(st, now)
      redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))
      local seq = 0
      if st and st[1] == now then
        seq = tonumber(string.match(st[2], ':(%d+)$')) or 0
      end
      -- One member per unit, added in batches (Lua's unpack has a small stack).
      local i = 1
      while i <= cost do
        local args = {}
        local last = i + 499
        if last > cost then
          last = cost
        end
        for j = i, last do
          args[#args + 1] = int(now)
          args[#args + 1] = int(now) .. ':' .. string.format('%010d', seq + j)
        end
        redis.call('ZADD', key, unpack(args))
        i = last + 1
      end
      redis.call('PEXPIRE', key, cdiv(window, 1000) + TTL_SLACK)
    end,
  }
end

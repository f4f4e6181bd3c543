-- Sliding log: twin of sliding_log.rs. Params: limit, window. State: a sorted set with one
-- member per admitted unit, scored by its time; members are "time:sequence", the sequence
-- zero-padded so that members of one time sort by it, and numbered on from the newest member
-- of that time (never reused while that member exists, even after a refund).
-- A block is one more member, "block:end", scored +inf: always the highest, never inside a
-- window (counts stop short of +inf), so the read of the newest entry finds it too. A key's
-- own limit is another, "limit:TAG" (TAG: the parameters it is decided under, see
-- `own_params`), above the block.
ALG[SLIDING_LOG] = function()
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

  return {
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

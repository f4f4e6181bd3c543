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
ACT[REFUND] = function(alg, key, p, st, now, units, _, keep, since)
  alg:refund(key, p, st, now, units, keep, since)
end
ACT[RESET] = function(_, key)
  -- The key's state, and its strikes' record, if it blocks on violation (see `strike`).
  call('DEL', key, key .. '!')
end
ACT[PENALIZE] = function(alg, key, p, st, now, units, _, keep, since)
  if units > 0 then
    alg:commit(key, p, st, now, units, keep, since)
  end
end
ACT[BLOCK] = function(alg, key, p, st, now, _, us, keep, since)
  alg:block(key, p, st, now, now + us, keep, since)
end
-- The algorithm's own give-back, else a refund until the lease's end: see `Kernel::give_back`.
ACT[GIVE_BACK] = function(alg, key, p, st, now, units, lease_end, keep, since)
  if alg.give_back then
    alg:give_back(key, p, st, now, lease_end, units, keep, since)
  elseif now <= lease_end then
    alg:refund(key, p, st, now, units, keep, since)
  end
end
-- The algorithm's own release, else its give-back: see `Kernel::release`.
ACT[RELEASE] = function(alg, key, p, st, now, units, at, keep, since)
  if alg.release then
    alg:release(key, p, st, now, at, units, keep, since)
  elseif alg.give_back then
    alg:give_back(key, p, st, now, at, units, keep, since)
  end
end

-- The difference between a request's real cost and its estimate, given back or owed (the
-- algorithm's own debit, else a charge: see `Kernel::debit`).
ACT[SETTLE] = function(alg, key, p, st, now, units, estimate, keep, since)
  if units < estimate then
    alg:refund(key, p, st, now, estimate - units, keep, since)
  elseif units > estimate then
    local debit = alg.debit or alg.commit
    debit(alg, key, p, st, now, units - estimate, keep, since)
  end
end

-- A key's own limit, `p` (its parameters, then '@' and its quota), until `limit_end` (0: the
-- longest window's time from now): the state converted from what it was written under.
ACT[LIMIT] = function(alg, key, p, st, now, from, limit_end, keep, since)
  if limit_end == 0 then
    limit_end = now + LONGEST
  end
  local at = find(p.tag, '@', 1, true)
  local tag = sub(p.tag, 1, at) .. int(limit_end) .. 'E0,' .. sub(p.tag, at + 1)
  put_under(alg, key, st, now, from, own_params(tag, p), keep, since)
end
-- Back under the policy's own quota (`p`), from a key's own limit.
ACT[UNLIMIT] = function(alg, key, p, st, now, from, _, keep, since)
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

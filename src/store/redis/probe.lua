-- The permission probe, run once by `build()`: every command the decision calls inside Redis,
-- on one key under the store's prefix, which it leaves deleted. A user without one of them
-- fails here, with Redis's message naming the command, rather than at a first decision.
-- TIME is called unless the store decides on a clock of its own (ARGV[1] is '0').
local k = KEYS[1]
if ARGV[1] == '1' then
  redis.call('TIME')
end
redis.call('SET', k, '0', 'PX', 1000)
redis.call('GET', k)
redis.call('PEXPIRE', k, 1000)
redis.call('PTTL', k)
redis.call('DEL', k)
redis.call('ZADD', k, 0, 'probe')
redis.call('PEXPIRE', k, 1000)
redis.call('ZCOUNT', k, 0, 1)
redis.call('ZRANGE', k, 0, 0)
redis.call('ZRANGEBYSCORE', k, 0, 1)
redis.call('ZREVRANGEBYSCORE', k, 1, 0)
redis.call('ZREMRANGEBYRANK', k, 0, 0)
redis.call('ZREMRANGEBYSCORE', k, 0, 1)
redis.call('DEL', k)
return 1

//! What `--help` prints: every variable the demo server reads.

/// The variables, with their defaults.
pub(crate) const HELP: &str = "\
tower-ratelimit demo server

Environment variables:
  BIND        address to listen on                  (default 127.0.0.1:3000)
  ADMIN_BIND  address of /metrics and /admin/top, to keep them off the public address
                                                    (default unset: served on BIND)
  ADMIN_TOKEN the bearer token /admin/* ask for (16 or more of letters, digits and
              -._~+/=); without it they answer loopback clients only, and the server
              will not start with them on an address other machines reach, nor with
              TRUSTED_PROXIES trusting a loopback address       (default unset)
  CONFIG      a TOML file of policies, e.g. examples/limits.toml, instead of ALGORITHM,
              RATE_LIMIT, KEY, TRUSTED_PROXIES, LEASE, WAIT_MS, CONCURRENCY, PRIORITY_HEADER,
              RESERVE, DENY, ALLOW, NEAR_LIMIT and BLOCK_* (which it replaces; setting both
              is an error). Reloaded on SIGHUP, keeping every key's
              usage; a file with a mistake is rejected and the old limits stay.
                                                    (default unset)
  REDIS_URL   unset: in-memory store; set: Redis (the server starts while Redis is down;
              ON_STORE_ERROR answers until it is up), e.g. redis://127.0.0.1:6379,
              redis+cluster://127.0.0.1:7000,127.0.0.1:7001 for a Redis Cluster, or
              redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster for the primary
              Redis Sentinel names; rediss://, rediss+cluster:// and rediss+sentinel://
              are TLS, trusting the system's roots unless REDIS_CA is set
                                                    (default unset)
  REDIS_USERNAME, REDIS_PASSWORD
              with REDIS_URL: the Redis ACL user and its password (or REDIS_PASSWORD
              alone, for requirepass), kept out of the URL (default unset)
  REDIS_CA    with a TLS REDIS_URL: a PEM file of the CA that signed Redis's certificate
                                                    (default unset: the system's roots)
  REDIS_CLIENT_CERT, REDIS_CLIENT_KEY
              with a TLS REDIS_URL: PEM files of the certificate and key this server
              presents to a Redis that asks for one (mutual TLS)  (default unset)
  HEADER_TIMEOUT_MS
              a connection that has not sent a whole request head this many
              milliseconds after it opened or after its last response (nothing, half
              an HTTP/1 head, the HTTP/2 preface) is closed; HTTP/2 pings at this
              interval close one whose peer went away (100 to 3600000; default 10000)
  PREFIX      key prefix in Redis                   (default rl:)
  PER_THREAD_READS
              without REDIS_URL: true gives the memory store's shards a reader lock per
              thread group, for hot keys decided on many cores; false one lock each
              (default unset: the layer chooses; true for one GCRA, or for two
              to four GCRAs and fixed windows)
  PRIORITY_HEADER, RESERVE
              a request header naming a request's priority, and the percent of each
              RATE_LIMIT policy kept for requests whose header says critical: the
              others are refused once they used the rest (e.g. PRIORITY_HEADER=x-priority
              RESERVE=20: the others get 80%)                (default unset)
  WORK_CAPACITY
              adds GET /work?ms=M (M defaults to 20): a backend that serves this many
              requests at a time, each taking M ms, the others queueing, so that its
              latency grows with its load as a database's does   (default unset)
  ADAPTIVE    gradient2 | aimd: an adaptive concurrency limit on GET /work, moved by
              the latency it sees; over it, 503 (temporary-reduced-capacity)
                                                    (default unset)
  ADAPTIVE_MIN, ADAPTIVE_MAX
              the adaptive limit's bounds                   (default 4 and 1000)
  ADAPTIVE_TIMEOUT_MS
              with ADAPTIVE=aimd: a request slower than this counts as a failure
              (default: twice the unloaded round trip AIMD learns)
  MAX_KEYS    without REDIS_URL: the most keys the memory store holds (default 100000)
  ON_STORE_ERROR
              what to do when Redis fails or is slow: open (let requests through),
              closed (503), local (decide in memory, each instance with the full limit)
                                                    (default open)
  STORE_TIMEOUT_MS
              the deadline of one decision in Redis, in milliseconds (default 50)
  ALGORITHM   gcra | token_bucket | leaky_bucket | fixed_window | sliding_window | sliding_log
              (default gcra; fixed_window with TIME_ZONE or a monthly RATE_LIMIT)
  RATE_LIMIT  a quota such as 10/s, 100/min, 20/10s, 2000/week, 10000/month, or several
              separated by commas, all enforced at once, e.g. 10/s,1000/h (default 10/s)
  POLICY_NAME the name of the RATE_LIMIT policy (of one quota), as 429 bodies, metrics
              and /admin/limits name it; with BODY_KEY, BODY_COST, JSONRPC or
              GRAPHQL_COST, the policy of the routes with bodies is <name>:body
              (default ALGORITHM:QUOTA, e.g. gcra:10/s)
  TIME_ZONE   every RATE_LIMIT policy of a day, a week or a month counts the calendar
              periods of this IANA zone, e.g. Europe/Paris: a day from local midnight, a
              month from the 1st (default unset: windows from the Unix epoch; a month
              in UTC)
  WEEK_STARTS, MONTH_STARTS
              the day calendar weeks start on (e.g. sunday; default monday) and the
              day of the month months start on (1 to 31; default 1)
  LEASE       with REDIS_URL: units each instance takes of a key at once and admits
              from without asking Redis, until spent or a lease ends (default unset:
              every request asks Redis)
  WAIT_MS     a request over the limit that a time within this many milliseconds
              admits waits for it instead of getting 429 (at most 3600000; default
              unset: never wait; not with LEASE)
  CONCURRENCY at most this many requests per key in flight at once, across every
              instance (default unset: no concurrency limit)
  CONCURRENCY_MAX_MS
              with CONCURRENCY: how long a slot is held at most, so that the slots of an
              instance that died are freed (default 60000)
  COST_HEADER every RATE_LIMIT policy admits a request on an estimate of 1 unit, then
              settles it at what the response header of this name says it cost (GET
              /spend sets it), past the limit if need be: a key in debt gets 429 until
              time pays it back              (default unset: a request costs 1)
  COST_BODY   bytes: the same, settled at the bytes the response body sent (GET
              /stream sends them), counted as it streams; json:<pointer>, e.g.
              json:/usage/total_tokens: at the number there in the response's JSON, or
              in its last server-sent event's (GET /llm sends them)
              (default unset; not with COST_HEADER)
  HEADERS     legacy (X-RateLimit-*) | ietf (RateLimit-Policy, RateLimit) | both
                                                    (default legacy)
  KEY         ip | client_ip | global | header:<name> (default ip)
              ip: the socket peer; client_ip: the client behind TRUSTED_PROXIES
  TRUSTED_PROXIES
              with KEY=client_ip, DENY or ALLOW: comma-separated networks or addresses of
              the proxies in front of the server, e.g. 10.0.0.0/8,2001:db8::/32;
              X-Forwarded-For is read only from them, from the right
                                                    (default empty: trust no proxy)
  DENY        comma-separated networks, addresses or keys answered 403 (problem+json),
              e.g. 203.0.113.0/24,2001:db8:bad::/48,scraper-7; a network is matched
              against the client's address (behind TRUSTED_PROXIES), a key against the
              key of KEY                                    (default unset)
  ALLOW       the same, never limited nor counted; a request on both lists is denied
                                                    (default unset)
  BLOCK_FOR   a key a RATE_LIMIT policy denies is blocked this long (e.g. 10s), denied
              whatever its state; each new block within a day doubles it (default unset)
  BLOCK_AFTER with BLOCK_FOR: block at this many denials within a minute (default 1)
  BLOCK_MAX   with BLOCK_FOR: the longest block (default 1h)
  BODY_KEY    a JSON pointer, e.g. /params/name: the value there in the request's JSON
              body joins KEY's key on the routes with bodies (POST /echo, /mcp and
              /graphql, as for BODY_COST, JSONRPC and GRAPHQL_COST: the others keep the
              plain RATE_LIMIT policies, counted apart) (KEY=ip BODY_KEY=/params/name: per client and tool);
              a body without it is keyed (missing), limited as any other (default unset)
  BODY_COST   a JSON pointer, e.g. /max_tokens: every RATE_LIMIT policy charges the
              number there in the request's JSON body; absent, negative or fractional
              is answered 400 (problem+json), charged nothing       (default unset)
  JSONRPC     true: the JSON-RPC method joins KEY's key (tools/call:<name> for an MCP
              tool call); a batch is charged per call in one decision, all or none,
              and a denied batch names its calls over       (default false)
  GRAPHQL_COST
              true: every RATE_LIMIT policy charges the calculated cost of the GraphQL
              query in the JSON body (every field 1; first or last multiply their
              field's selection; fragments expanded): { viewer { repositories(first: 10)
              { nodes { name stars } } } } costs 32; a query that does not parse, or
              is deeper than GRAPHQL_MAX_DEPTH fields, is answered 400 (default false)
  GRAPHQL_MAX_DEPTH
              with GRAPHQL_COST: the deepest query allowed, in fields (default 10)
  BODY_LIMIT  the most bytes of a body read for BODY_KEY, BODY_COST, JSONRPC and
              GRAPHQL_COST; more is answered 413, a body not all there within 10 s
              408, a body that is not JSON 400, each charged as its floor would be
              (default 65536)
  BATCH_CALLS the most calls of a JSON-RPC batch (a JSON array body); more is
              answered 413 batch_too_large, an empty batch 400 (default 32)
  BATCH_KEYS  the most distinct keys a policy makes of a batch's calls; more is
              answered 413 batch_too_many_keys (default 8)
  BODY_READING_PER_KEY
              the most bodies read at once for one key (KEY); one more is answered
              429 bodies_in_flight at once, unread (default 16)
  MIN_BODY_COST
              the least a cost read from the body (BODY_COST, GRAPHQL_COST) counts;
              0 lets a body stating 0 through uncharged (default 1)
  MESSAGE_LIMIT
              a quota, e.g. 5/s: the messages a key (KEY) may send on its sockets of
              GET /ws, shared across its sockets and across the servers of one store,
              decided by ALGORITHM                  (default unset: not limited)
  ON_MESSAGE_LIMIT
              what a message over MESSAGE_LIMIT gets: close (the socket is closed with
              1008 and a reason naming the limit), wait (it is echoed when the limit
              allows, nothing more read meanwhile; past 10 s the socket is closed with
              1013), or error (a text message {\"error\":\"rate_limited\",
              \"retry_after_ms\":N,...}, the socket kept open)   (default close)
  CONNECTIONS at most this many sockets of GET /ws open at once per key (KEY), across
              the servers of one store; past it the upgrade is answered 429 with
              Retry-After; a closed socket frees its place at once
                                                    (default unset)
  MAX_CONNECTION_S
              a socket of GET /ws open longer is closed with 1013 (with CONNECTIONS
              and without it, an hour: a socket's place is held in the store that
              long at most)                         (default unset)
  WS_MAX_MESSAGE
              the largest message (and frame) a socket of GET /ws reads, in bytes (1 to
              67108864): past it the socket is closed with 1009, message too big
                                                    (default 1048576)
  NEAR_LIMIT  warn when a key has used this percent of a RATE_LIMIT policy, e.g. 80:
              once per key and window, counted in ratelimit_near_limit_total on /metrics,
              the key listed in near_keys on /admin/top   (default unset)

Routes:
  GET /        rate limited, answers 200 with a short text
  POST /login  rate limited, answers 401 unless the header x-password is \"letmein\"
  GET /reports, GET /exports/{id}
               rate limited, answer 200 (routes of examples/limits.toml)
  GET /slow?ms=<n>
               rate limited, answers after n milliseconds (at most 10000), to see
               CONCURRENCY at work
  GET /spend?cost=<n>
               rate limited, answers 200 with the COST_HEADER header (x-cost when unset)
               set to n, the response's real cost for COST_HEADER
  GET /stream?bytes=<n>
               rate limited, streams n bytes (at most 10000000) in chunks of 1000, the
               response's real cost for COST_BODY=bytes
  POST /echo   rate limited, answers the request body as it came
  POST /mcp    rate limited, answers a JSON-RPC result for each call (an array for a
               batch), naming its method and tool
  POST /graphql
               rate limited, answers {\"data\":null}
  GET /llm?tokens=<n>[&stream=true]
               rate limited, answers {\"usage\":{\"total_tokens\":n}}, or with
               stream=true three server-sent events, the last carrying that usage
  GET /ws      rate limited when it opens; a WebSocket echoing text and binary messages
               as they came, each decided by MESSAGE_LIMIT, at most CONNECTIONS at once
               per key, each open MAX_CONNECTION_S at most
  GET /health  never limited
  GET /metrics every metric of the layer, in Prometheus text format, with the server's
               live tokio tasks (demo_tasks_alive) and the memory store's keys
               (demo_memory_store_keys); never limited
  GET /admin/top?policy=<name>&n=<count>
               the keys each policy denied most over the last minute, as JSON (policy
               and n are optional; n defaults to 10); never limited
  PUT /admin/limits/<policy>/<key>?quota=<quota>&until=<unix seconds>
               gives one key a limit of its own, e.g. quota=100/min, on every instance
               sharing the store, its usage kept, until the time given (optional: a
               year); 204, or 400 naming a bad parameter; never limited
  DELETE /admin/limits/<policy>/<key>
               ends it: the key is back under its policy's quota; 204
  PUT /admin/deny/<key>?until=<unix seconds>, PUT /admin/allow/<key>?until=...
               puts a key (as KEY names it) on the deny or allow list, on every instance
               sharing the store from its next request, until the time given (optional:
               until deleted); 204, or 400 naming a bad parameter; 409 with LEASE,
               whose leases are spent without asking Redis. An entry with a / is a
               network (127.0.0.0%2F24): its clients' addresses are on the list, on this
               instance at once and on the others within a second
  DELETE /admin/deny/<key>, DELETE /admin/allow/<key>
               takes it off; 204
  With ADMIN_BIND set, /metrics and /admin/* are answered there, and not on BIND.
  /admin/* answer the holder of ADMIN_TOKEN (Authorization: Bearer <token>), or without
  it loopback clients naming localhost or a loopback address (127.0.0.1, [::1]) as
  Host only, with none of Forwarded, X-Forwarded-For and X-Real-IP (401 or 403
  otherwise); /metrics is open where they are served.
";

//! Guides: how to do each thing the crate does, with examples that run as tests.
//!
//! The crate's front page teaches the concepts (policies, keys, stores, what happens when the
//! store fails); these pages go through one task each.
//!
//! | guide | what it shows |
//! |---|---|
//! | [`policies`] | several limits in one layer: per route, per plan, failed logins only; the IETF `RateLimit` fields |
//! | [`keys`] | whom a request is charged to: peer IP, client IP behind proxies, API keys, your own |
//! | [`waits`] | a request just over the limit waiting for its turn instead of a 429 |
//! | [`plans`] | quotas the way API products sell them: a day, a week or a month in a time zone, per plan |
//! | [`limits`] | one key's limit changed at runtime, on every instance, until a given time |
//! | [`costs`] | costs known once the response is done: LLM tokens per minute and per day, bytes sent |
//! | [`body`] | keys and costs in the request body: MCP tools, JSON-RPC batches, GraphQL costs, LLM tokens |
//! | [`streams`] | messages inside WebSockets and other long-lived connections: per key, across instances; close, wait or an error |
//! | [`egress`] | calls to an upstream within its limits, shared by every instance: LLM tokens per minute, a partner's quota; pauses learned from its 429s |
//! | [`concurrency`] | how many requests may be in flight at once |
//! | [`overload`] | when the service itself is the bottleneck: an adaptive concurrency limit, capacity kept for priority |
//! | [`abuse`] | abusive clients: blocks that escalate, allow and deny lists of networks and keys, a warning before the limit |
//! | [`reload`] | limits from a TOML file, changed while running |
//! | [`redis`] | one limit shared by several instances: Redis, Redis Cluster, Sentinel |
//! | [`grpc`] | a tonic server, answered with gRPC statuses |
//! | [`production`] | deadlines and failure policies, leases, the circuit breaker, the deny cache, metrics, the top limited keys |
//! | [`performance`] | what a decision costs, in memory and in Redis, against the crates and scripts it is compared with |

#[doc = include_str!("policies.md")]
pub mod policies {}

#[doc = include_str!("keys.md")]
pub mod keys {}

#[doc = include_str!("waits.md")]
pub mod waits {}

#[doc = include_str!("plans.md")]
pub mod plans {}

#[doc = include_str!("limits.md")]
pub mod limits {}

#[doc = include_str!("costs.md")]
pub mod costs {}

#[cfg(feature = "graphql")]
#[doc = include_str!("body.md")]
pub mod body {}

#[cfg(feature = "ws")]
#[doc = include_str!("streams.md")]
pub mod streams {}

#[doc = include_str!("egress.md")]
pub mod egress {}

#[doc = include_str!("concurrency.md")]
pub mod concurrency {}

#[doc = include_str!("overload.md")]
pub mod overload {}

#[doc = include_str!("abuse.md")]
pub mod abuse {}

#[doc = include_str!("reload.md")]
pub mod reload {}

#[doc = include_str!("redis.md")]
pub mod redis {}

#[doc = include_str!("grpc.md")]
pub mod grpc {}

#[doc = include_str!("production.md")]
pub mod production {}

#[doc = include_str!("performance.md")]
pub mod performance {}

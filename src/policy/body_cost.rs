//! Where a policy reads a request's cost in its body (`Policy::cost_json`,
//! `Policy::cost_graphql`, in `body_costs.rs`), and the cost it reads.

use crate::error::KeyRejection;
use crate::key::RequestRef;

/// Where a policy reads a request's cost in its body.
#[derive(Clone, Debug)]
pub(crate) enum BodyCost {
    /// The number at a JSON pointer.
    #[cfg(feature = "json")]
    Json(std::sync::Arc<str>),
    /// The calculated cost of its GraphQL query, no deeper than `max_depth`.
    #[cfg(feature = "graphql")]
    Graphql { max_depth: u32 },
}

impl BodyCost {
    /// The units `request` costs, or why its body states none.
    pub(crate) fn of(&self, request: &RequestRef<'_>) -> Result<u64, KeyRejection> {
        #[cfg(not(feature = "json"))]
        let _ = request;
        match *self {
            #[cfg(feature = "json")]
            BodyCost::Json(ref pointer) => crate::key::cost_at(request, pointer),
            #[cfg(feature = "graphql")]
            BodyCost::Graphql { max_depth } => graphql(request, max_depth),
        }
    }
}

/// The calculated cost of `request`'s GraphQL query (its body's, computed once for every
/// policy; or a batch's call's), or why it has none.
#[cfg(feature = "graphql")]
fn graphql(request: &RequestRef<'_>, max_depth: u32) -> Result<u64, KeyRejection> {
    let measured = match (request.call(), request.body()) {
        (None, Some(body)) => body.graphql_cost(),
        _ => crate::key::body_json(request).map(crate::graphql::request_cost)?,
    };
    let cost = measured
        .map_err(|e| KeyRejection::bad_request("bad_graphql", format!("the GraphQL query: {e}")))?;
    if cost.depth > max_depth {
        return Err(KeyRejection::bad_request(
            "graphql_too_deep",
            format!(
                "the GraphQL query is {} fields deep, deeper than the {max_depth} allowed",
                cost.depth
            ),
        ));
    }
    Ok(cost.cost)
}

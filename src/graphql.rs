//! The calculated cost of a GraphQL query, known before any resolver runs
//! ([`Policy::cost_graphql`](crate::Policy::cost_graphql)).
//!
//! The cost, exactly as computed:
//!
//! - every field costs 1, `__typename` and the fields of a mutation or subscription too;
//! - a field with a `first` or `last` argument (the larger, when both are given) multiplies
//!   the cost of its selection by that number: a literal, or a variable (its value in the
//!   request's `variables`, else its default);
//! - fragments and inline fragments cost what their selections cost, where they are spread:
//!   a fragment spread twice costs twice;
//! - the query's depth is its deepest field's nesting (fragments add none).
//!
//! So `{ viewer { repositories(first: 10) { nodes { name stars } } } }` costs
//! 1 (`viewer`) + 1 (`repositories`) + 10 × (1 + 1 + 1) = **32**, at depth 4.
//!
//! ```
//! use tower_ratelimit::graphql::query_cost;
//!
//! let cost = query_cost("{ viewer { repositories(first: 10) { nodes { name stars } } } }", None, None)?;
//! assert_eq!((cost.cost, cost.depth), (32, 4));
//! # Ok::<(), tower_ratelimit::graphql::GraphqlError>(())
//! ```
//!
//! Beside the published models, which need the schema (which fields are objects,
//! connections, scalars):
//!
//! | | this crate | GitHub (GraphQL API) | Shopify (Admin API) |
//! |---|---|---|---|
//! | a scalar field | 1 | 0 | 0 |
//! | an object field | 1 | 0 | 1 |
//! | a connection with `first: n` | 1 + n × its selection | the requests it takes to fetch (its parents' count), summed, divided by 100, rounded; at least 1 a query | 2 + n × its selection |
//! | a mutation | its fields | as a query | 10 |
//! | what is limited | any quota | 5,000 points an hour per user; at most 500,000 nodes a query | a bucket of points refilled each second, sized by the shop's plan |
//!
//! Charging every field 1 makes this cost an upper bound of the work a query asks for, in
//! the same spirit: a client asking for ten thousand nodes pays for ten thousand. A query's
//! depth is limited by the policy, its size by the body's bound, and its parsing by limits on
//! nesting and tokens.
//!
//! Its selections may nest at most [`MOST_NESTED`] (128) deep, the selections of the
//! fragments it spreads included: each field with a selection, each inline fragment and each
//! fragment spread where it is spread goes one deeper, so that a chain of fragments, each
//! spreading the next, is as deep as its links. A query nested deeper has no cost (an error,
//! which a policy answers with `400 Bad Request`), and costing one uses a stack of a few
//! hundred kilobytes at most, whatever the query.
//!
//! ```
//! use tower_ratelimit::graphql::query_cost;
//!
//! let links: String = (0..200).map(|i| format!("fragment F{i} on Q {{ ...F{} }} ", i + 1)).collect();
//! let chain = format!("{{ ...F0 }} {links} fragment F200 on Q {{ a }}");
//! let refused = query_cost(&chain, None, None).unwrap_err();
//! assert!(refused.to_string().contains("more than 128 deep"), "{refused}");
//! ```

use std::collections::HashMap;
use std::fmt;

use apollo_parser::Parser;
use apollo_parser::cst;
use serde_json::{Map, Value};

/// The most nested selections a query may have to be parsed at all (deeper: an error); a
/// policy's own depth limit is lower.
const RECURSION_LIMIT: usize = 128;

/// The most tokens a query may have.
const TOKEN_LIMIT: usize = 50_000;

/// The most nested selections a query may have, those of the fragments it spreads included
/// (see the [module](self)): a deeper one has no cost.
pub const MOST_NESTED: usize = RECURSION_LIMIT;

/// A query's calculated cost and depth (see the [module](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryCost {
    /// The units the query costs.
    pub cost: u64,
    /// Its deepest field's nesting.
    pub depth: u32,
}

/// Why a query has no cost: a syntax error (with its line and column), an operation or
/// fragment that is not there, a variable without a value, a bad `first` or `last`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphqlError(String);

impl fmt::Display for GraphqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GraphqlError {}

fn error(message: impl Into<String>) -> GraphqlError {
    GraphqlError(message.into())
}

/// The cost of the operation `operation` (the only one when `None`) of the GraphQL document
/// `query`, its variables' values in `variables`.
pub fn query_cost(
    query: &str,
    operation: Option<&str>,
    variables: Option<&Map<String, Value>>,
) -> Result<QueryCost, GraphqlError> {
    let tree = Parser::new(query)
        .recursion_limit(RECURSION_LIMIT)
        .token_limit(TOKEN_LIMIT)
        .parse();
    if let Some(e) = tree.errors().next() {
        let (line, column) = place(query, e.index());
        return Err(error(format!(
            "the query does not parse at line {line}, column {column}: {}",
            e.message()
        )));
    }
    let mut operations = Vec::new();
    let mut fragments = HashMap::new();
    for definition in tree.document().definitions() {
        match definition {
            cst::Definition::OperationDefinition(op) => operations.push(op),
            cst::Definition::FragmentDefinition(f) => {
                if let Some(name) = f.fragment_name().and_then(|n| n.name()) {
                    fragments.insert(name.text().to_string(), f);
                }
            }
            _ => {}
        }
    }
    let op = chosen(operations, operation)?;
    let mut costing = Costing {
        fragments,
        done: HashMap::new(),
        spreading: Vec::new(),
        nested: 0,
        reached: 0,
        variables,
        defaults: defaults(&op),
    };
    let set = op
        .selection_set()
        .ok_or_else(|| error("the operation selects nothing"))?;
    let (cost, depth) = costing.selection(&set)?;
    Ok(QueryCost { cost, depth })
}

/// The cost of the GraphQL request `body` (`{"query": ..., "operationName": ...,
/// "variables": {...}}`, as GraphQL over HTTP sends it).
pub fn request_cost(body: &Value) -> Result<QueryCost, GraphqlError> {
    let query = (body.get("query").and_then(Value::as_str))
        .ok_or_else(|| error("the body has no \"query\" string"))?;
    let operation = body.get("operationName").and_then(Value::as_str);
    let variables = body.get("variables").and_then(Value::as_object);
    query_cost(query, operation, variables)
}

/// The operation named `name`, or the only one.
fn chosen(
    operations: Vec<cst::OperationDefinition>,
    name: Option<&str>,
) -> Result<cst::OperationDefinition, GraphqlError> {
    let named = |op: &cst::OperationDefinition| op.name().map(|n| n.text().to_string());
    match name {
        Some(name) => (operations.into_iter())
            .find(|op| named(op).as_deref() == Some(name))
            .ok_or_else(|| error(format!("the query has no operation {name:?}"))),
        None if operations.len() == 1 => Ok(operations.into_iter().next().expect("one")),
        None if operations.is_empty() => Err(error("the query has no operation")),
        None => Err(error(format!(
            "the query has {} operations: name one in \"operationName\"",
            operations.len()
        ))),
    }
}

/// The default values of `op`'s variables.
fn defaults(op: &cst::OperationDefinition) -> HashMap<String, cst::Value> {
    let definitions = op.variable_definitions();
    (definitions.iter().flat_map(|d| d.variable_definitions()))
        .filter_map(|d| {
            let name = d.variable()?.name()?.text().to_string();
            Some((name, d.default_value()?.value()?))
        })
        .collect()
}

/// The line and column (from 1, in characters) of byte `index` of `text`.
fn place(text: &str, index: usize) -> (usize, usize) {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A query being costed: its fragments (each costed once), and its variables.
struct Costing<'a> {
    fragments: HashMap<String, cst::FragmentDefinition>,
    /// Each fragment costed: its cost, depth, and how deep its selections nest.
    done: HashMap<String, (u64, u32, usize)>,
    /// The fragments being costed, to find one that spreads itself.
    spreading: Vec<String>,
    /// How deep the selection being costed is, fragments' included (at most [`MOST_NESTED`]).
    nested: usize,
    /// The deepest `nested` has been.
    reached: usize,
    variables: Option<&'a Map<String, Value>>,
    defaults: HashMap<String, cst::Value>,
}

impl Costing<'_> {
    /// The cost and depth of `set`, one deeper than the selection it is in.
    fn selection(&mut self, set: &cst::SelectionSet) -> Result<(u64, u32), GraphqlError> {
        if self.nested >= MOST_NESTED {
            return Err(error(format!(
                "the query nests selections more than {MOST_NESTED} deep, the fragments it \
                 spreads included"
            )));
        }
        self.nested += 1;
        self.reached = self.reached.max(self.nested);
        let measured = self.selections(set);
        self.nested -= 1;
        measured
    }

    /// The cost and depth of the selections of `set`.
    fn selections(&mut self, set: &cst::SelectionSet) -> Result<(u64, u32), GraphqlError> {
        let (mut cost, mut depth) = (0u64, 0u32);
        for selection in set.selections() {
            let (c, d) = match selection {
                cst::Selection::Field(field) => {
                    let (inner, below) = match field.selection_set() {
                        Some(set) => self.selection(&set)?,
                        None => (0, 0),
                    };
                    let times = self.multiplier(&field)?;
                    (inner.saturating_mul(times).saturating_add(1), below + 1)
                }
                cst::Selection::FragmentSpread(spread) => {
                    let name = (spread.fragment_name().and_then(|n| n.name()))
                        .map(|n| n.text().to_string())
                        .unwrap_or_default();
                    self.fragment(&name)?
                }
                cst::Selection::InlineFragment(inline) => match inline.selection_set() {
                    Some(set) => self.selection(&set)?,
                    None => (0, 0),
                },
            };
            cost = cost.saturating_add(c);
            depth = depth.max(d);
        }
        Ok((cost, depth))
    }

    /// The cost and depth of the fragment `name`, costed once (and as deep, wherever it is
    /// spread).
    fn fragment(&mut self, name: &str) -> Result<(u64, u32), GraphqlError> {
        if let Some(&(cost, depth, nests)) = self.done.get(name) {
            if self.nested + nests > MOST_NESTED {
                return Err(error(format!(
                    "the query nests selections more than {MOST_NESTED} deep, the fragments it \
                     spreads included"
                )));
            }
            self.reached = self.reached.max(self.nested + nests);
            return Ok((cost, depth));
        }
        if self.spreading.iter().any(|n| n == name) {
            return Err(error(format!("the fragment {name} spreads itself")));
        }
        let set = (self.fragments.get(name))
            .ok_or_else(|| error(format!("the query has no fragment {name}")))?
            .selection_set();
        self.spreading.push(name.to_owned());
        let reached = std::mem::replace(&mut self.reached, self.nested);
        let measured = match set {
            Some(set) => self.selection(&set)?,
            None => (0, 0),
        };
        let nests = self.reached - self.nested;
        self.reached = self.reached.max(reached);
        self.spreading.pop();
        self.done
            .insert(name.to_owned(), (measured.0, measured.1, nests));
        Ok(measured)
    }

    /// What `field`'s selection is multiplied by: its `first` or `last` (the larger), or 1.
    fn multiplier(&self, field: &cst::Field) -> Result<u64, GraphqlError> {
        let mut times = None;
        let arguments = field.arguments();
        for argument in arguments.iter().flat_map(|a| a.arguments()) {
            let Some(name) = argument.name().map(|n| n.text().to_string()) else {
                continue;
            };
            if name != "first" && name != "last" {
                continue;
            }
            if let Some(n) = self.count(&name, argument.value())? {
                times = Some(times.map_or(n, |t: u64| t.max(n)));
            }
        }
        Ok(times.unwrap_or(1))
    }

    /// The number `value` of the argument `name` says (`None`: null, no multiplier).
    fn count(&self, name: &str, value: Option<cst::Value>) -> Result<Option<u64>, GraphqlError> {
        let bad = |what: &str| error(format!("{name} is {what}: a count is a whole number"));
        match value {
            Some(cst::Value::IntValue(n)) => {
                let n = i32::try_from(&n).map_err(|_| bad("too large"))?;
                u64::try_from(n).map(Some).map_err(|_| bad("negative"))
            }
            Some(cst::Value::NullValue(_)) => Ok(None),
            Some(cst::Value::Variable(v)) => {
                let variable = v.name().map(|n| n.text().to_string()).unwrap_or_default();
                match self.variables.and_then(|vs| vs.get(&variable)) {
                    Some(Value::Null) => Ok(None),
                    Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| bad("not whole")),
                    Some(_) => Err(bad(&format!("${variable}, not a number"))),
                    None => match self.defaults.get(&variable) {
                        Some(default) => self.count(name, Some(default.clone())),
                        None => Err(error(format!(
                            "{name} is ${variable}, which has no value in \"variables\""
                        ))),
                    },
                }
            }
            _ => Err(bad("not a number")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{QueryCost, query_cost, request_cost};

    fn cost(query: &str) -> (u64, u32) {
        let QueryCost { cost, depth } = query_cost(query, None, None).unwrap();
        (cost, depth)
    }

    fn err(query: &str) -> String {
        query_cost(query, None, None).unwrap_err().to_string()
    }

    #[test]
    fn fields_cost_one_and_first_or_last_multiplies_their_selection() {
        let issue = "{ viewer { repositories(first: 10) { nodes { name stars } } } }";
        assert_eq!(cost(issue), (32, 4));
        assert_eq!(cost("{ a b c }"), (3, 1));
        assert_eq!(cost("{ a(last: 5) { b } }"), (6, 2));
        assert_eq!(cost("{ a(first: 2, last: 7) { b } }"), (8, 2));
        assert_eq!(cost("{ a(first: 0) { b c } }"), (1, 2));
        assert_eq!(cost("{ a(first: null) { b } }"), (2, 2));
        // Nested connections multiply: 1 + 10 × (1 + 20 × 1).
        assert_eq!(cost("{ a(first: 10) { b(first: 20) { c } } }"), (211, 3));
    }

    #[test]
    fn fragments_are_expanded_where_spread() {
        let q =
            "query { a { ...F ... on T { d } } b { ...F } } fragment F on T { x(first: 3) { y } }";
        // F costs 1 + 3 = 4; a: 1 + 4 + 1 = 6; b: 1 + 4 = 5.
        assert_eq!(cost(q), (11, 3));
        assert!(err("{ ...G } fragment G on Q { ...G }").contains("the fragment G spreads itself"));
        assert!(err("{ ...H }").contains("no fragment H"));
    }

    #[test]
    fn variables_give_counts_and_their_defaults_too() {
        let q = "query Q($n: Int = 4, $m: Int) { a(first: $n) { b } c(first: $m) { d } }";
        let vars = json!({"m": 3});
        let with = |v: &serde_json::Value| query_cost(q, None, v.as_object()).map(|c| c.cost);
        assert_eq!(with(&vars), Ok(5 + 4));
        assert_eq!(with(&json!({"n": 1, "m": 1})), Ok(2 + 2));
        let missing = query_cost(q, None, None).unwrap_err().to_string();
        assert!(missing.contains("$m, which has no value"), "{missing}");
        assert!(
            with(&json!({"m": -1}))
                .unwrap_err()
                .to_string()
                .contains("not whole")
        );
        assert!(err("{ a(first: -2) { b } }").contains("negative"));
        assert!(err("{ a(first: \"x\") { b } }").contains("not a number"));
    }

    #[test]
    fn operations_are_chosen_by_name() {
        let q = "query A { a } query B { b c }";
        assert_eq!(query_cost(q, Some("B"), None).unwrap().cost, 2);
        assert!(err(q).contains("2 operations: name one"));
        assert!(
            query_cost(q, Some("C"), None)
                .unwrap_err()
                .to_string()
                .contains("no operation \"C\"")
        );
        let body = json!({"query": q, "operationName": "A"});
        assert_eq!(request_cost(&body).unwrap().cost, 1);
        assert!(
            request_cost(&json!({"q": 1}))
                .unwrap_err()
                .to_string()
                .contains("no \"query\"")
        );
    }

    #[test]
    fn a_syntax_error_names_its_place() {
        let e = err("{\n  a {\n    b(first: ) }\n}");
        assert!(e.contains("line 3"), "{e}");
        let deep = format!("{}{}", "{ a ".repeat(200), "}".repeat(200));
        assert!(err(&deep).contains("does not parse"));
    }

    #[test]
    fn huge_counts_saturate() {
        let q = "{ a(first: 2000000000) { b(first: 2000000000) { c(first: 2000000000) { d } } } }";
        assert_eq!(cost(q).0, u64::MAX);
    }

    /// A chain of `links` fragments, each spreading the next, the last selecting a field.
    fn chain(links: usize) -> String {
        let mut q = String::from("{ ...F0 }");
        for i in 0..links {
            q.push_str(&format!(" fragment F{i} on Q {{ ...F{} }}", i + 1));
        }
        q.push_str(&format!(" fragment F{links} on Q {{ a }}"));
        q
    }

    #[test]
    fn fragments_nest_no_deeper_than_the_bound() {
        // The operation's selection, then one a fragment: 1 + 127 = 128.
        assert_eq!(cost(&chain(126)), (1, 1));
        let e = err(&chain(127));
        assert!(e.contains("more than 128 deep"), "{e}");
        let long = err(&chain(2_000));
        assert!(long.contains("more than 128 deep"), "{long}");
        // A fragment costed once is as deep where it is spread again, deeper.
        let g = format!(" fragment G on Q {}{}", "{ a ".repeat(100), "}".repeat(100));
        assert!(query_cost(&format!("{{ ...G }}{g}"), None, None).is_ok());
        let again = format!(
            "{{ ...G x {}...G{} }}{g}",
            "{ b ".repeat(30),
            " }".repeat(30)
        );
        assert!(
            err(&again).contains("more than 128 deep"),
            "{}",
            err(&again)
        );
        // Inline fragments nest too (as deep as the parser allows, within the bound).
        let inline = format!("{{ {}a{} }}", "... on Q { ".repeat(127), " }".repeat(127));
        assert_eq!(cost(&inline), (1, 1));
        let e = err(&format!("{{ ...F }} fragment F on Q {inline}"));
        assert!(e.contains("more than 128 deep"), "{e}");
    }

    /// The deepest queries within the bounds, costed on a thread of `stack` bytes.
    fn deepest_on(stack: usize) -> bool {
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn(|| {
                let fields = format!("{}z{}", "{ a ".repeat(126), " }".repeat(126));
                let inline = format!("{{ {}a{} }}", "... on Q { ".repeat(126), " }".repeat(126));
                let half = format!("{}...F0{}", "{ a ".repeat(60), " }".repeat(60));
                let links: String = (0..60)
                    .map(|i| format!(" fragment F{i} on Q {{ ...F{} }}", i + 1))
                    .collect();
                let mixed = format!("{half}{links} fragment F60 on Q {{ b {{ c }} }}");
                for q in [chain(126), fields, inline, mixed] {
                    assert!(q.len() < 64 << 10);
                    query_cost(&q, None, None).unwrap();
                }
                // A longer chain, within the body's bound and the tokens': refused, not
                // followed to its end.
                let long = chain(2_000);
                assert!(long.len() < 64 << 10);
                assert!(query_cost(&long, None, None).is_err());
            })
            .unwrap()
            .join()
            .is_ok()
    }

    #[test]
    fn the_deepest_query_allowed_is_costed_on_a_small_stack() {
        // (A debug build's frames: about 300 KiB are needed.)
        assert!(deepest_on(512 << 10));
    }
}

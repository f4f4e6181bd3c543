//! What the benches driven by hand share: their medians and their `--name value` arguments
//! (included by path, as the rest of `common` needs the `redis` feature).

/// The median of `values`.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The number after `name` in `args`, else `default`.
pub(crate) fn arg(args: &[String], name: &str, default: usize) -> usize {
    (args.iter().position(|a| a == name))
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

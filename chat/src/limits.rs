//! Bounds on one chat-template render: a template is untrusted input (it comes
//! from a GGUF, a request's `template` field or `/api/create`), so no render
//! may loop, recurse, grow memory or run without a limit.
//!
//! - **Fuel** (minijinja's, in our patched copy, `chat/vendor/PATCHES.md`): one
//!   unit per instruction, per [`BYTES_PER_FUEL`] bytes of a string an operator
//!   (`+`, `~`, `*`) builds or raw text written, per item of a sequence built;
//!   our filters and methods charge their results the same way. So loops,
//!   doubling strings or lists and exponential macros all run out of fuel.
//! - **Recursion**: minijinja's recursion limit (a macro call counts 4).
//! - **Sizes**: a filter or method that would build more than the output cap
//!   (`indent`, `center`, `format`, `replace`, `join`, `tojson`, …) or read a
//!   collection longer than [`RenderLimits::max_items`] (`sort`, `list`,
//!   `batch`, …) is refused before it runs; the output is capped as it grows.
//! - **Time**: checked whenever a filter, method or `{{ … }}` runs.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use minijinja::value::{Object, Rest, Value, ValueKind};
use minijinja::{filters, Environment, Error, ErrorKind, State};

/// Bytes of text that cost one unit of fuel (the patched minijinja's rate).
pub const BYTES_PER_FUEL: usize = 16;

/// Limits on one render; [`RenderLimits::default`] is what every
/// [`crate::ChatTemplate`] uses unless told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// Fuel for one render: instructions, plus one per [`BYTES_PER_FUEL`]
    /// bytes and per sequence item built.
    pub fuel: u64,
    /// minijinja's recursion limit (nested blocks, includes; a macro call counts 4).
    pub recursion_limit: usize,
    /// The largest rendered prompt, and the largest text one filter may build.
    pub max_output_bytes: usize,
    /// The longest sequence or map a filter or method may read.
    pub max_items: usize,
    /// Wall time for one render.
    pub time_limit: Duration,
}

impl Default for RenderLimits {
    /// Far above what a real chat template needs for a long conversation with
    /// tools (a few hundred thousand instructions, output a few times the
    /// messages' size), far below what hurts the process: 5,000,000 fuel is
    /// about a quarter of a second of a tight loop, or 80 MB of text built.
    fn default() -> Self {
        Self {
            fuel: 5_000_000,
            recursion_limit: 200,
            max_output_bytes: 16 << 20,
            max_items: 1_000_000,
            time_limit: Duration::from_secs(1),
        }
    }
}

/// Which limit a render ran into; the message names it and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error(
        "it ran out of fuel ({fuel} units: one per instruction, per 16 bytes or per list item \
         built), so it loops or builds too much"
    )]
    Fuel { fuel: u64 },
    #[error("it recursed deeper than the recursion limit ({limit})")]
    Recursion { limit: usize },
    #[error("its output would exceed the size limit of {max_bytes} bytes ({what})")]
    Output { max_bytes: usize, what: String },
    #[error("{what} would read more than the limit of {max_items} items")]
    Items { max_items: usize, what: String },
    #[error("it ran past the time limit of {limit:?}")]
    Time { limit: Duration },
    #[error("it built a value over minijinja's size limit: {0}")]
    Value(String),
    #[error(
        "it nested a value deeper than {} levels of lists and maps, or put a namespace in a \
         namespace",
        minijinja::value::MAX_NESTING
    )]
    Nesting,
}

impl LimitExceeded {
    /// The limit a minijinja error reports, if it is one.
    pub(crate) fn from_error(err: &Error, limits: &RenderLimits) -> Option<Self> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(current) = cause {
            if let Some(hit) = current.downcast_ref::<LimitExceeded>() {
                return Some(hit.clone());
            }
            cause = current.source();
        }
        if err.kind() == ErrorKind::OutOfFuel {
            return Some(Self::Fuel { fuel: limits.fuel });
        }
        let detail = err.detail().unwrap_or_default();
        if detail.contains("recursion limit") {
            return Some(Self::Recursion {
                limit: limits.recursion_limit,
            });
        }
        if detail.contains("may nest at most") {
            return Some(Self::Nesting);
        }
        for marker in ["is too large", "too many elements"] {
            if detail.contains(marker) {
                return Some(Self::Value(detail.to_owned()));
            }
        }
        None
    }

    fn into_error(self) -> Error {
        Error::new(ErrorKind::InvalidOperation, self.to_string()).with_source(self)
    }
}

/// Per-render bookkeeping, kept in the render's `State` (created at the first
/// check, which is close to the render's start: before it only fuel-charged
/// instructions run).
#[derive(Debug)]
struct Meter {
    deadline: Instant,
    output_bytes: AtomicUsize,
}

impl Object for Meter {}

const METER: &str = "__hypura_render_meter";

fn meter(state: &State, limits: &RenderLimits) -> std::sync::Arc<Meter> {
    state.get_or_set_temp_object(METER, || Meter {
        deadline: Instant::now() + limits.time_limit,
        output_bytes: AtomicUsize::new(0),
    })
}

fn check_time(state: &State, limits: &RenderLimits) -> Result<(), Error> {
    if Instant::now() > meter(state, limits).deadline {
        return Err(LimitExceeded::Time {
            limit: limits.time_limit,
        }
        .into_error());
    }
    Ok(())
}

/// Counts `bytes` of `{{ … }}` output against the output cap and the fuel.
pub(crate) fn charge_output(
    state: &State,
    limits: &RenderLimits,
    bytes: usize,
) -> Result<(), Error> {
    check_time(state, limits)?;
    let total = meter(state, limits)
        .output_bytes
        .fetch_add(bytes, Ordering::Relaxed)
        .saturating_add(bytes);
    if total > limits.max_output_bytes {
        return Err(output_error(limits, "the rendered prompt"));
    }
    state.consume_fuel((bytes / BYTES_PER_FUEL) as u64)
}

/// Refuses to print a collection whose text would pass the output cap
/// (before printing it: a deeply shared nested list is small in memory but
/// exponential as text).
pub(crate) fn check_printable(limits: &RenderLimits, value: &Value) -> Result<(), Error> {
    if is_collection(value) {
        let cap = limits.max_output_bytes;
        check_text(limits, text_len_estimate(value, cap), "a printed value")?;
    }
    Ok(())
}

fn output_error(limits: &RenderLimits, what: impl Into<String>) -> Error {
    LimitExceeded::Output {
        max_bytes: limits.max_output_bytes,
        what: what.into(),
    }
    .into_error()
}

/// Filters and methods whose result nests deeper than what they were given
/// (`x|batch(1)|batch(1)|…` nests two levels a filter).
const NESTING_FILTERS: &[&str] = &["batch", "slice", "groupby", "items", "dictsort", "zip"];

/// Charges a value a filter or method built, as the VM charges operators.
fn charge_value(state: &State, value: &Value) -> Result<(), Error> {
    let fuel = match value.as_str() {
        Some(text) => text.len() / BYTES_PER_FUEL,
        None if is_collection(value) => value.len().unwrap_or(0),
        None => 0,
    };
    state.consume_fuel(fuel as u64)
}

/// Bounds the nesting of what a filter or method `name` built, as the VM
/// bounds the lists and maps it builds; only for the few that nest deeper
/// than their input.
fn check_nesting(state: &State, name: &str, value: &Value) -> Result<(), Error> {
    if !NESTING_FILTERS.contains(&name) {
        return Ok(());
    }
    state.check_nesting(value, minijinja::value::MAX_NESTING, false)
}

fn is_collection(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
    )
}

/// Items of a collection, counting a lazy one only up to `max + 1`.
fn item_count(value: &Value, max: usize) -> usize {
    match value.len() {
        Some(len) => len,
        None => value
            .try_iter()
            .map(|items| items.take(max.saturating_add(1)).count())
            .unwrap_or(0),
    }
}

fn check_items(value: &Value, limits: &RenderLimits, what: &str) -> Result<(), Error> {
    if is_collection(value) && item_count(value, limits.max_items) > limits.max_items {
        return Err(LimitExceeded::Items {
            max_items: limits.max_items,
            what: what.to_owned(),
        }
        .into_error());
    }
    Ok(())
}

/// An upper estimate of a value's text length, stopping once over `cap`.
pub(crate) fn text_len_estimate(value: &Value, cap: usize) -> usize {
    if let Some(text) = value.as_str() {
        return text.len();
    }
    if !is_collection(value) {
        return 32;
    }
    let mut total = 2usize;
    let Ok(items) = value.try_iter() else {
        return total;
    };
    for item in items {
        let mut len = text_len_estimate(&item, cap).saturating_add(2);
        if value.kind() == ValueKind::Map {
            let entry = value.get_item(&item).unwrap_or_default();
            len = len.saturating_add(text_len_estimate(&entry, cap).saturating_add(2));
        }
        total = total.saturating_add(len);
        if total > cap {
            break;
        }
    }
    total
}

fn check_text(limits: &RenderLimits, bytes: usize, what: &str) -> Result<(), Error> {
    if bytes > limits.max_output_bytes {
        return Err(output_error(limits, what));
    }
    Ok(())
}

/// A filter's argument by position (after the value) or keyword.
fn arg(args: &[Value], position: usize, name: &str) -> Option<Value> {
    let kwargs = args.last().filter(|last| last.is_kwargs());
    let positional = args.len() - usize::from(kwargs.is_some());
    if position < positional {
        return args.get(position).cloned();
    }
    kwargs
        .and_then(|kwargs| kwargs.get_item(&Value::from(name)).ok())
        .filter(|value| !value.is_undefined())
}

/// Nodes and depth of a value, as `tojson(indent=…)` lays it out one node a
/// line; counting stops at `max_nodes`.
fn json_shape(value: &Value, max_nodes: usize) -> (usize, usize) {
    if !is_collection(value) {
        return (1, 0);
    }
    let (mut nodes, mut depth) = (1usize, 0usize);
    let Ok(items) = value.try_iter() else {
        return (nodes, 1);
    };
    for item in items {
        let child = match value.kind() {
            ValueKind::Map => value.get_item(&item).unwrap_or_default(),
            _ => item,
        };
        let (child_nodes, child_depth) = json_shape(&child, max_nodes);
        nodes = nodes.saturating_add(child_nodes);
        depth = depth.max(child_depth);
        if nodes > max_nodes {
            break;
        }
    }
    (nodes, depth + 1)
}

fn as_usize(value: Option<&Value>) -> usize {
    value
        .and_then(|v| v.as_i64())
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(0)
}

fn str_arg(value: Option<&Value>) -> &str {
    value.and_then(Value::as_str).unwrap_or_default()
}

fn str_len(value: Option<&Value>) -> usize {
    value.and_then(Value::as_str).map_or(0, str::len)
}

/// The largest text `replace(old, new)` on `text` can make.
fn replaced_len(text: &str, old: &str, new_len: usize) -> usize {
    let matches = if old.is_empty() {
        text.chars().count() + 1
    } else {
        text.matches(old).count()
    };
    text.len().saturating_add(matches.saturating_mul(new_len))
}

/// An upper bound of what printf- or `str.format`-style formatting can make:
/// the format, every argument's text, every number (a width from an argument)
/// and every digit run of the format (a width or precision) added up.
fn formatted_len(format: &str, args: &[Value], cap: usize) -> usize {
    let mut total = format.len();
    for arg in args {
        total = total.saturating_add(text_len_estimate(arg, cap));
        total = total.saturating_add(as_usize(Some(arg)));
    }
    for run in format.split(|c: char| !c.is_ascii_digit()) {
        if !run.is_empty() {
            total = total.saturating_add(run.parse::<usize>().unwrap_or(usize::MAX));
        }
    }
    total
}

/// The size checks a filter needs before it runs; `args[0]` is the value.
fn check_filter(name: &str, args: &[Value], limits: &RenderLimits) -> Result<(), Error> {
    let cap = limits.max_output_bytes;
    let value = args.first();
    if let Some(value) = value {
        check_items(value, limits, &format!("the {name} filter"))?;
    }
    let text = value.and_then(Value::as_str).unwrap_or_default();
    let what = format!("the {name} filter");
    match name {
        "indent" => {
            let lines = text.bytes().filter(|&b| b == b'\n').count() + 1;
            let width = arg(args, 1, "width").map_or(4, |w| {
                w.as_str().map_or_else(|| as_usize(Some(&w)), str::len)
            });
            check_text(
                limits,
                text.len().saturating_add(lines.saturating_mul(width)),
                &what,
            )
        }
        "tojson" => {
            let value = value.cloned().unwrap_or_default();
            let indent = as_usize(arg(args, 2, "indent").as_ref());
            let (nodes, depth) = json_shape(&value, limits.max_items);
            let layout = nodes.saturating_mul(indent.saturating_mul(depth).saturating_add(1));
            let text = text_len_estimate(&value, cap).saturating_add(layout);
            check_text(limits, text, &what)
        }
        "replace" => check_text(
            limits,
            replaced_len(text, str_arg(args.get(1)), str_len(args.get(2))),
            &what,
        ),
        "format" => {
            let format_args = args.get(1..).unwrap_or_default();
            check_text(limits, formatted_len(text, format_args, cap), &what)
        }
        "join" => {
            let items = value.map_or(0, |v| text_len_estimate(v, cap));
            let count = value.map_or(0, |v| item_count(v, limits.max_items));
            let separator = arg(args, 1, "d").map_or(0, |d| str_len(Some(&d)));
            let separators = count.saturating_mul(separator);
            check_text(limits, items.saturating_add(separators), &what)
        }
        "string" | "pprint" => check_text(
            limits,
            value.map_or(0, |v| text_len_estimate(v, cap)),
            &what,
        ),
        "batch" | "slice" => {
            let count = as_usize(arg(args, 1, "count").as_ref());
            if count > limits.max_items {
                return Err(LimitExceeded::Items {
                    max_items: limits.max_items,
                    what,
                }
                .into_error());
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The size checks a Python-style method needs before it runs.
fn check_method(
    value: &Value,
    method: &str,
    args: &[Value],
    limits: &RenderLimits,
) -> Result<(), Error> {
    let cap = limits.max_output_bytes;
    let what = format!("the .{method}() method");
    check_items(value, limits, &what)?;
    for arg in args {
        check_items(arg, limits, &what)?;
    }
    let Some(text) = value.as_str() else {
        return Ok(());
    };
    match method {
        "replace" => check_text(
            limits,
            replaced_len(text, str_arg(args.first()), str_len(args.get(1))),
            &what,
        ),
        "format" => check_text(limits, formatted_len(text, args, cap), &what),
        "join" => {
            let items = args.first().map_or(0, |v| text_len_estimate(v, cap));
            let count = args.first().map_or(0, |v| item_count(v, limits.max_items));
            check_text(
                limits,
                items.saturating_add(count.saturating_mul(text.len())),
                &what,
            )
        }
        "center" | "ljust" | "rjust" | "zfill" => {
            check_text(limits, text.len().max(as_usize(args.first())), &what)
        }
        _ => Ok(()),
    }
}

/// minijinja's built-in filters, each run behind [`check_filter`] and charged.
fn builtin_filters() -> Vec<(&'static str, Value)> {
    vec![
        ("safe", Value::from_function(filters::safe)),
        ("escape", Value::from_function(filters::escape)),
        ("e", Value::from_function(filters::escape)),
        ("lower", Value::from_function(filters::lower)),
        ("upper", Value::from_function(filters::upper)),
        ("title", Value::from_function(filters::title)),
        ("capitalize", Value::from_function(filters::capitalize)),
        ("replace", Value::from_function(filters::replace)),
        ("length", Value::from_function(filters::length)),
        ("count", Value::from_function(filters::length)),
        ("dictsort", Value::from_function(filters::dictsort)),
        ("items", Value::from_function(filters::items)),
        ("reverse", Value::from_function(filters::reverse)),
        ("trim", Value::from_function(filters::trim)),
        ("join", Value::from_function(filters::join)),
        ("split", Value::from_function(filters::split)),
        ("lines", Value::from_function(filters::lines)),
        ("default", Value::from_function(filters::default)),
        ("d", Value::from_function(filters::default)),
        ("round", Value::from_function(filters::round)),
        ("abs", Value::from_function(filters::abs)),
        ("int", Value::from_function(filters::int)),
        ("float", Value::from_function(filters::float)),
        ("attr", Value::from_function(filters::attr)),
        ("first", Value::from_function(filters::first)),
        ("last", Value::from_function(filters::last)),
        ("min", Value::from_function(filters::min)),
        ("max", Value::from_function(filters::max)),
        ("sort", Value::from_function(filters::sort)),
        ("list", Value::from_function(filters::list)),
        ("bool", Value::from_function(filters::bool)),
        ("batch", Value::from_function(filters::batch)),
        ("slice", Value::from_function(filters::slice)),
        ("sum", Value::from_function(filters::sum)),
        ("indent", Value::from_function(filters::indent)),
        ("select", Value::from_function(filters::select)),
        ("reject", Value::from_function(filters::reject)),
        ("selectattr", Value::from_function(filters::selectattr)),
        ("rejectattr", Value::from_function(filters::rejectattr)),
        ("map", Value::from_function(filters::map)),
        ("groupby", Value::from_function(filters::groupby)),
        ("unique", Value::from_function(filters::unique)),
        ("chain", Value::from_function(filters::chain)),
        ("zip", Value::from_function(filters::zip)),
        ("pprint", Value::from_function(filters::pprint)),
        ("format", Value::from_function(filters::format)),
    ]
}

/// Registers `filter` under `name`, checked and charged.
pub(crate) fn add_bounded_filter(
    env: &mut Environment<'static>,
    limits: RenderLimits,
    name: &'static str,
    filter: Value,
) {
    env.add_filter(
        name,
        move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
            check_time(state, &limits)?;
            check_filter(name, &args, &limits)?;
            let rv = filter.call(state, &args)?;
            charge_value(state, &rv)?;
            check_nesting(state, name, &rv)?;
            Ok(rv)
        },
    );
}

/// Sets fuel and recursion limits, replaces every built-in filter with a
/// bounded one and bounds Python-style methods. Filters added after this
/// (the chat ones) are bounded by registering them with [`add_bounded_filter`].
pub(crate) fn bound_environment(env: &mut Environment<'static>, limits: RenderLimits) {
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion_limit);
    for (name, filter) in builtin_filters() {
        add_bounded_filter(env, limits, name, filter);
    }
    env.set_unknown_method_callback(move |state, value, method, args| {
        check_time(state, &limits)?;
        check_method(value, method, args, &limits)?;
        let rv = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)?;
        charge_value(state, &rv)?;
        check_nesting(state, method, &rv)?;
        Ok(rv)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions};

    /// The limit `source` runs into, at [`ChatTemplate::new`] (its probes
    /// render it), under the default limits but a time limit no render here
    /// reaches, so that what runs out does not depend on this machine's load.
    fn limit_hit(source: &str) -> LimitExceeded {
        let limits = RenderLimits {
            time_limit: Duration::from_secs(600),
            ..RenderLimits::default()
        };
        limit_hit_with(source, limits)
    }

    fn limit_hit_with(source: &str, limits: RenderLimits) -> LimitExceeded {
        match ChatTemplate::with_limits(source, "", "", limits) {
            Err(ChatTemplateError::Limit(hit)) => hit,
            Err(other) => panic!("{source}: expected a limit, got {other}"),
            Ok(_) => panic!("{source}: rendered without hitting a limit"),
        }
    }

    fn is_fuel(hit: &LimitExceeded) -> bool {
        matches!(hit, LimitExceeded::Fuel { fuel } if *fuel == RenderLimits::default().fuel)
    }

    fn is_output(hit: &LimitExceeded) -> bool {
        matches!(hit, LimitExceeded::Output { max_bytes, .. } if *max_bytes == 16 << 20)
    }

    #[test]
    fn a_triple_range_loop_runs_out_of_fuel() {
        let hit = limit_hit(
            "{% for a in range(100000) %}{% for b in range(100000) %}\
             {% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
        );
        assert!(is_fuel(&hit), "{hit}");
        assert!(hit.to_string().contains("ran out of fuel (5000000 units"));
    }

    /// A list nested in itself 500,000 times in a loop, or a namespace put
    /// in itself, overflowed the render thread's stack when the value was
    /// printed, serialized, compared or dropped, and the process aborted
    /// (the gateway's own, for `/api/create`'s template check). Each is
    /// refused as it is built; this test's thread has Rust's 2 MiB stack.
    #[test]
    fn values_nested_without_bound_or_in_themselves_are_refused() {
        let deep_loop = "{% set ns = namespace(x=[1]) %}{% for j in range(5) %}\
                         {% for i in range(100000) %}{% set ns.x = STEP %}{% endfor %}\
                         {% endfor %}{{ ns.x }}";
        let mut sources: Vec<String> = [
            "[ns.x]",
            "{'a': ns.x}",
            "dict(a=ns.x)",
            "namespace(a=ns.x)",
            "ns.x|batch(1)|list",
            "[ns.x]|map('list')|list",
            "{'a': ns.x}.items()|list",
        ]
        .iter()
        .map(|step| deep_loop.replace("STEP", step))
        .collect();
        sources.push("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}".into());
        sources.push("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns|tojson }}".into());
        sources.push(format!("{{{{ [1]{} }}}}", "|batch(1)".repeat(300)));
        for source in &sources {
            assert_eq!(limit_hit(source), LimitExceeded::Nesting, "{source}");
        }
        // The error names the limit; a value at it is fine.
        assert!(LimitExceeded::Nesting
            .to_string()
            .contains("deeper than 128 levels"));
        let nested_127 = "{% set ns = namespace(x=1) %}{% for i in range(127) %}\
                          {% set ns.x = [ns.x] %}{% endfor %}";
        let at_limit = format!("{nested_127}{{{{ [ns.x] == [ns.x] }}}}{{{{ [ns.x] }}}}");
        ChatTemplate::new(&at_limit, "", "").unwrap();
        assert_eq!(
            limit_hit(&format!("{nested_127}{{{{ [[ns.x]] }}}}")),
            LimitExceeded::Nesting
        );
    }

    #[test]
    fn raw_text_in_a_loop_is_charged_by_size() {
        let raw = "x".repeat(4096);
        let source = format!(
            "{{% for a in range(100000) %}}{{% for b in range(100000) %}}{raw}\
             {{% endfor %}}{{% endfor %}}"
        );
        assert!(is_fuel(&limit_hit(&source)));
    }

    #[test]
    fn a_gigabyte_string_multiplication_is_refused() {
        let hit = limit_hit("{{ 'a' * 1000000000 }}");
        assert_eq!(
            hit,
            LimitExceeded::Value("repeated string is too large".into())
        );
    }

    #[test]
    fn doubling_a_string_in_a_loop_stops() {
        for op in ["ns.s ~ ns.s", "ns.s + ns.s", "ns.s * 2"] {
            let source = format!(
                "{{% set ns = namespace(s='ab') %}}{{% for i in range(64) %}}\
                 {{% set ns.s = {op} %}}{{% endfor %}}{{{{ ns.s }}}}"
            );
            let hit = limit_hit(&source);
            assert!(
                is_fuel(&hit) || matches!(hit, LimitExceeded::Value(_)),
                "{op}: {hit}"
            );
        }
    }

    #[test]
    fn doubling_by_many_statements_without_a_loop_stops() {
        let mut source = "{% set s0 = 'a' * 10000000 %}".to_owned();
        for i in 1..40 {
            source.push_str(&format!("{{% set s{i} = s{} ~ s{} %}}", i - 1, i - 1));
        }
        source.push_str("{{ s39 }}");
        let hit = limit_hit(&source);
        assert!(
            is_fuel(&hit) || matches!(hit, LimitExceeded::Value(_)),
            "{hit}"
        );
    }

    #[test]
    fn constant_folding_does_not_build_big_strings_at_compile_time() {
        let source = "{% set x = 'a' * 100000000 %}".repeat(200);
        assert!(is_fuel(&limit_hit(&source)));
    }

    #[test]
    fn macro_doubling_recursion_runs_out_of_fuel() {
        let calls = limit_hit(
            "{% macro d(n) %}{% if n > 0 %}{{ d(n - 1) }}{{ d(n - 1) }}{% else %}x{% endif %}\
             {% endmacro %}{{ d(30) }}",
        );
        assert!(is_fuel(&calls), "{calls}");
        let text = limit_hit(
            "{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% else %}{{ s }}{% endif %}\
             {% endmacro %}{{ d('ab', 60) }}",
        );
        assert!(
            is_fuel(&text) || matches!(text, LimitExceeded::Value(_)),
            "{text}"
        );
    }

    #[test]
    fn deep_recursion_hits_the_recursion_limit() {
        let hit = limit_hit("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
        assert_eq!(hit, LimitExceeded::Recursion { limit: 200 });
    }

    #[test]
    fn indent_bombs_are_refused_before_they_run() {
        assert!(is_output(&limit_hit("{{ 'a\nb' | indent(1000000000) }}")));
        assert!(is_output(&limit_hit(
            "{{ 'a\nb' | indent(width=1000000000) }}"
        )));
        assert!(is_output(&limit_hit(
            "{{ ('x\n' * 10000000) | indent(100) }}"
        )));
    }

    #[test]
    fn tojson_bombs_are_refused_before_they_run() {
        assert!(is_output(&limit_hit(
            "{{ [[[[1, 2]]]] | tojson(indent=1000000000) }}"
        )));
        let shared = "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}\
                      {% set ns.l = [ns.l, ns.l] %}{% endfor %}";
        // Each `[ns.l, ns.l]` walks what it holds for its nesting (every
        // path: 2^i of them), so the doubling now runs out of fuel while it
        // builds, or its print passes the output cap.
        for print in ["{{ ns.l | tojson }}", "{{ ns.l }}", "{{ ns.l | string }}"] {
            let hit = limit_hit(&format!("{shared}{print}"));
            assert!(is_output(&hit) || is_fuel(&hit), "{print}: {hit}");
        }
        let concat = limit_hit(&format!("{shared}{{{{ ns.l ~ '' }}}}"));
        assert!(
            is_fuel(&concat) || matches!(concat, LimitExceeded::Value(_)),
            "{concat}"
        );
    }

    #[test]
    fn format_bombs_are_refused_before_they_run() {
        assert!(is_output(&limit_hit("{{ '%1000000000s' | format('a') }}")));
        assert!(is_output(&limit_hit("{{ '{:>1000000000}'.format('a') }}")));
        assert!(is_output(&limit_hit(
            "{{ '{:>{}}'.format('a', 1000000000) }}"
        )));
    }

    #[test]
    fn replace_and_join_bombs_are_refused_before_they_run() {
        assert!(is_output(&limit_hit(
            "{{ ('a' * 1000000) | replace('a', 'b' * 1000) }}"
        )));
        assert!(is_output(&limit_hit(
            "{{ ('a' * 1000000).replace('a', 'b' * 1000) }}"
        )));
        assert!(is_output(&limit_hit(
            "{{ (['a' * 1000000] * 1000) | join }}"
        )));
        assert!(is_output(&limit_hit(
            "{{ ('x' * 100000).join(['a' * 100000] * 1000) }}"
        )));
    }

    #[test]
    fn huge_sorts_are_refused() {
        let hit = limit_hit("{{ ((range(100000) | list) * 20) | sort | length }}");
        assert!(
            matches!(hit, LimitExceeded::Items { max_items: 1_000_000, ref what } if what == "the sort filter"),
            "{hit}"
        );
        let repeated =
            limit_hit("{% for i in range(100000) %}{{ range(100000) | sort | first }}{% endfor %}");
        assert!(is_fuel(&repeated), "{repeated}");
        assert!(matches!(
            limit_hit("{{ [1] | batch(1000000000, 'x') | list }}"),
            LimitExceeded::Items { .. }
        ));
    }

    #[test]
    fn the_time_limit_stops_a_render_of_many_cheap_calls() {
        let limits = RenderLimits {
            fuel: u64::MAX / 2,
            time_limit: Duration::from_millis(1),
            ..RenderLimits::default()
        };
        let hit = limit_hit_with(
            "{% for a in range(100000) %}{% for b in range(100) %}{{ 'x' | upper }}\
             {% endfor %}{% endfor %}",
            limits,
        );
        assert_eq!(
            hit,
            LimitExceeded::Time {
                limit: Duration::from_millis(1)
            }
        );
        assert!(hit.to_string().contains("time limit of 1ms"));
    }

    #[test]
    fn a_bomb_behind_a_message_is_refused_at_render() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{% if m.content == 'boom' %}{{ 'a\nb' | indent(1000000000) }}\
             {% endif %}{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .expect("the probes render it");
        let err = template
            .render(
                &[ChatMessage::new("user", "boom")],
                &RenderOptions::default(),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ChatTemplateError::Limit(LimitExceeded::Output { .. })
        ));
        assert!(
            err.to_string().starts_with(
                "the chat template was stopped: its output would exceed the size limit of \
                 16777216 bytes (the indent filter)"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_output_is_capped_as_it_grows() {
        let limits = RenderLimits {
            max_output_bytes: 1000,
            ..RenderLimits::default()
        };
        let hit = limit_hit_with(
            "{% for i in range(1000) %}{{ 'abcdefghij' }}{% endfor %}",
            limits,
        );
        assert!(
            matches!(hit, LimitExceeded::Output { max_bytes: 1000, ref what } if what == "the rendered prompt"),
            "{hit}"
        );
    }

    #[test]
    fn filters_keep_working_with_keyword_arguments() {
        let template = ChatTemplate::new(
            "{{ 'a\nb' | indent(width=2, first=true) }}|{{ {'k': [1]} | tojson(indent=2) }}|\
             {{ ['x', 'y'] | join('-') }}|{{ '%s=%d' | format('n', 3) }}",
            "",
            "",
        )
        .unwrap();
        let out = template.render(&[], &RenderOptions::default()).unwrap();
        assert_eq!(out, "  a\n  b|{\n  \"k\": [\n    1\n  ]\n}|x-y|n=3");
    }
}

//! The JSONPath subset that printer columns (`additionalPrinterColumns[].jsonPath`) use.
//!
//! Supported, following `k8s.io/client-go/util/jsonpath` as kube-apiserver runs it for
//! CRD columns (missing keys allowed):
//!
//! - optional `{…}` around the whole expression and an optional leading `$`;
//! - child names: `.spec.phase`; a backslash escapes the next character, so
//!   `.metadata.labels.rlark\.io/x` names the label key `rlark.io/x`;
//! - `*` as a child name: every value of an object (or element of an array);
//! - brackets: `[0]`, `[-1]` (from the end), `[*]`, `['name']` / `["name"]`;
//! - filters `[?(@.a.b == "x")]`, `!=`, and existence `[?(@.a)]`, comparing with a quoted
//!   string, a number, `true`, `false` or `null`.
//!
//! Not supported (rejected with [`JsonPathError::Unsupported`]): recursive descent `..`,
//! slices `[a:b]`, unions `[a,b]`, ranges and the other template functions.
//!
//! Evaluation never fails on data: a missing key, an out-of-range index or a type mismatch
//! just yields no match, as with `AllowMissingKeys(true)`.

use serde_json::Value;

/// Why a path expression could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonPathError {
    #[error("empty JSONPath expression")]
    Empty,
    #[error("invalid JSONPath {path:?} at offset {offset}: {message}")]
    Syntax {
        path: String,
        offset: usize,
        message: String,
    },
    #[error("unsupported JSONPath feature in {path:?}: {feature}")]
    Unsupported { path: String, feature: &'static str },
}

/// A parsed path, reusable across objects.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Child of an object by name.
    Child(String),
    /// Every child of an object or element of an array.
    Wildcard,
    /// Array element; negative counts from the end.
    Index(i64),
    /// Array elements matching a condition.
    Filter(Filter),
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    /// Path relative to `@`.
    path: Vec<Step>,
    /// `None`: the path merely has to exist.
    comparison: Option<(Comparison, Value)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Eq,
    Ne,
}

/// The first value `path` selects in `object` (`Ok(None)` if nothing matches).
///
/// Printer columns show only the first match, as kube-apiserver does for CRD columns, so
/// `.spec.tasks[*].role` yields the first task's role.
pub fn eval(object: &Value, path: &str) -> Result<Option<Value>, JsonPathError> {
    Ok(JsonPath::parse(path)?.first(object).cloned())
}

impl JsonPath {
    /// Parse an expression such as `.status.conditions[?(@.type=="Ready")].status`.
    pub fn parse(path: &str) -> Result<Self, JsonPathError> {
        let trimmed = path.trim();
        let inner = match trimmed.strip_prefix('{') {
            Some(rest) => rest
                .strip_suffix('}')
                .ok_or_else(|| syntax(path, trimmed.len(), "missing closing '}'"))?,
            None => trimmed,
        };
        let inner = inner.trim();
        if inner.is_empty() {
            return Err(JsonPathError::Empty);
        }
        let inner = inner.strip_prefix('$').unwrap_or(inner);
        let mut parser = Parser {
            path,
            chars: inner.chars().collect(),
            pos: 0,
        };
        let steps = parser.steps(false)?;
        if parser.pos != parser.chars.len() {
            return Err(parser.error("unexpected character"));
        }
        Ok(Self { steps })
    }

    /// Every value the path selects, in document order.
    pub fn all<'a>(&self, object: &'a Value) -> Vec<&'a Value> {
        select(&self.steps, object)
    }

    /// The first value the path selects.
    pub fn first<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.all(object).into_iter().next()
    }
}

fn syntax(path: &str, offset: usize, message: &str) -> JsonPathError {
    JsonPathError::Syntax {
        path: path.to_string(),
        offset,
        message: message.to_string(),
    }
}

fn select<'a>(steps: &[Step], object: &'a Value) -> Vec<&'a Value> {
    let mut current = vec![object];
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            match (step, value) {
                (Step::Child(name), Value::Object(map)) => next.extend(map.get(name)),
                (Step::Wildcard, Value::Object(map)) => next.extend(map.values()),
                (Step::Wildcard, Value::Array(items)) => next.extend(items.iter()),
                (Step::Index(index), Value::Array(items)) => {
                    let len = items.len() as i64;
                    let resolved = if *index < 0 { len + index } else { *index };
                    if (0..len).contains(&resolved) {
                        next.extend(items.get(resolved as usize));
                    }
                }
                (Step::Filter(filter), Value::Array(items)) => {
                    next.extend(items.iter().filter(|item| filter.matches(item)));
                }
                _ => {}
            }
        }
        current = next;
    }
    current
}

impl Filter {
    fn matches(&self, item: &Value) -> bool {
        let found = select(&self.path, item);
        match &self.comparison {
            None => !found.is_empty(),
            Some((comparison, literal)) => {
                let equal = found.iter().any(|value| loosely_equal(value, literal));
                match comparison {
                    Comparison::Eq => equal,
                    Comparison::Ne => !found.is_empty() && !equal,
                }
            }
        }
    }
}

/// Numbers compare by value (`1` equals `1.0`), everything else structurally.
fn loosely_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

struct Parser<'p> {
    path: &'p str,
    chars: Vec<char>,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: &str) -> JsonPathError {
        syntax(self.path, self.pos, message)
    }

    fn unsupported(&self, feature: &'static str) -> JsonPathError {
        JsonPathError::Unsupported {
            path: self.path.to_string(),
            feature,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    /// Steps until the end, or (inside a filter) until a comparison operator or `)`.
    fn steps(&mut self, in_filter: bool) -> Result<Vec<Step>, JsonPathError> {
        let mut steps = Vec::new();
        while let Some(c) = self.peek() {
            match c {
                '.' => {
                    self.pos += 1;
                    if self.peek() == Some('.') {
                        return Err(self.unsupported("recursive descent '..'"));
                    }
                    let name = self.name()?;
                    steps.push(if name == "*" {
                        Step::Wildcard
                    } else {
                        Step::Child(name)
                    });
                }
                '[' => steps.push(self.bracket()?),
                c if in_filter && (c.is_whitespace() || c == '=' || c == '!' || c == ')') => break,
                _ if steps.is_empty() && !in_filter => {
                    // kube accepts a first name without the leading dot (`spec.phase`).
                    let name = self.name()?;
                    steps.push(if name == "*" {
                        Step::Wildcard
                    } else {
                        Step::Child(name)
                    });
                }
                _ => return Err(self.error("expected '.' or '['")),
            }
        }
        Ok(steps)
    }

    /// A child name after `.`: up to the next unescaped `.` or `[` (or filter delimiter).
    fn name(&mut self) -> Result<String, JsonPathError> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            match c {
                '\\' => {
                    self.pos += 1;
                    let escaped = self.peek().ok_or_else(|| self.error("dangling '\\'"))?;
                    name.push(escaped);
                    self.pos += 1;
                }
                '.' | '[' => break,
                c if c.is_whitespace() || c == '=' || c == '!' || c == ')' => break,
                _ => {
                    name.push(c);
                    self.pos += 1;
                }
            }
        }
        if name.is_empty() {
            return Err(self.error("empty field name"));
        }
        Ok(name)
    }

    fn bracket(&mut self) -> Result<Step, JsonPathError> {
        self.pos += 1; // '['
        self.skip_spaces();
        let step = match self.peek() {
            Some('*') => {
                self.pos += 1;
                Step::Wildcard
            }
            Some(quote @ ('\'' | '"')) => Step::Child(self.quoted(quote)?),
            Some('?') => Step::Filter(self.filter()?),
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let start = self.pos;
                self.pos += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                let text: String = self.chars[start..self.pos].iter().collect();
                let index = text
                    .parse::<i64>()
                    .map_err(|_| syntax(self.path, start, "invalid array index"))?;
                Step::Index(index)
            }
            _ => return Err(self.error("expected index, '*', quoted name or filter")),
        };
        self.skip_spaces();
        match self.peek() {
            Some(']') => {
                self.pos += 1;
                Ok(step)
            }
            Some(':') => Err(self.unsupported("array slices")),
            Some(',') => Err(self.unsupported("unions")),
            _ => Err(self.error("expected ']'")),
        }
    }

    fn quoted(&mut self, quote: char) -> Result<String, JsonPathError> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some('\\') => {
                    self.pos += 1;
                    let escaped = self
                        .peek()
                        .ok_or_else(|| self.error("unterminated string"))?;
                    text.push(escaped);
                    self.pos += 1;
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    return Ok(text);
                }
                Some(c) => {
                    text.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// `?(@.path)`, `?(@.path == literal)`, `?(@.path != literal)`.
    fn filter(&mut self) -> Result<Filter, JsonPathError> {
        self.pos += 1; // '?'
        self.skip_spaces();
        if self.peek() != Some('(') {
            return Err(self.error("expected '(' after '?'"));
        }
        self.pos += 1;
        self.skip_spaces();
        if self.peek() != Some('@') {
            return Err(self.error("filter must start with '@'"));
        }
        self.pos += 1;
        let path = self.steps(true)?;
        self.skip_spaces();
        let comparison = match (self.peek(), self.chars.get(self.pos + 1).copied()) {
            (Some('='), Some('=')) => Some(Comparison::Eq),
            (Some('!'), Some('=')) => Some(Comparison::Ne),
            (Some(')'), _) => None,
            _ => return Err(self.unsupported("filter operators other than == and !=")),
        };
        let comparison = match comparison {
            Some(op) => {
                self.pos += 2;
                self.skip_spaces();
                Some((op, self.literal()?))
            }
            None => None,
        };
        self.skip_spaces();
        if self.peek() != Some(')') {
            return Err(self.error("expected ')' to close the filter"));
        }
        self.pos += 1;
        Ok(Filter { path, comparison })
    }

    fn literal(&mut self) -> Result<Value, JsonPathError> {
        match self.peek() {
            Some(quote @ ('\'' | '"')) => Ok(Value::String(self.quoted(quote)?)),
            Some(_) => {
                let start = self.pos;
                while self.peek().is_some_and(|c| !c.is_whitespace() && c != ')') {
                    self.pos += 1;
                }
                let text: String = self.chars[start..self.pos].iter().collect();
                match text.as_str() {
                    "true" => Ok(Value::Bool(true)),
                    "false" => Ok(Value::Bool(false)),
                    "null" => Ok(Value::Null),
                    _ => serde_json::from_str::<serde_json::Number>(&text)
                        .map(Value::Number)
                        .map_err(|_| {
                            syntax(
                                self.path,
                                start,
                                "expected a quoted string, number, true, false or null",
                            )
                        }),
                }
            }
            None => Err(self.error("missing comparison value")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object() -> Value {
        json!({
            "metadata": {"name": "j1", "labels": {"rlark.io/x": "yes", "plain": "p"}},
            "spec": {"tasks": [{"role": "actor", "replicas": 2}, {"role": "learner", "replicas": 1}]},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Scheduled", "status": "True"},
                    {"type": "Ready", "status": "False"}
                ]
            }
        })
    }

    #[test]
    fn simple_paths() {
        let o = object();
        assert_eq!(eval(&o, ".status.phase").unwrap(), Some(json!("Running")));
        assert_eq!(eval(&o, "{.metadata.name}").unwrap(), Some(json!("j1")));
        assert_eq!(eval(&o, "$.metadata.name").unwrap(), Some(json!("j1")));
        assert_eq!(eval(&o, "metadata.name").unwrap(), Some(json!("j1")));
        assert_eq!(
            eval(&o, ".spec").unwrap().unwrap()["tasks"][0]["role"],
            "actor"
        );
    }

    #[test]
    fn missing_is_none_not_error() {
        let o = object();
        assert_eq!(eval(&o, ".status.node").unwrap(), None);
        assert_eq!(eval(&o, ".status.phase.deeper").unwrap(), None);
        assert_eq!(eval(&o, ".spec.tasks[5].role").unwrap(), None);
        assert_eq!(eval(&o, ".metadata[0]").unwrap(), None);
    }

    #[test]
    fn escaped_dots_and_quoted_names() {
        let o = object();
        assert_eq!(
            eval(&o, r".metadata.labels.rlark\.io/x").unwrap(),
            Some(json!("yes"))
        );
        assert_eq!(
            eval(&o, ".metadata.labels['rlark.io/x']").unwrap(),
            Some(json!("yes"))
        );
        assert_eq!(
            eval(&o, r#".metadata.labels["plain"]"#).unwrap(),
            Some(json!("p"))
        );
    }

    #[test]
    fn indexes_and_wildcards() {
        let o = object();
        assert_eq!(
            eval(&o, ".spec.tasks[1].role").unwrap(),
            Some(json!("learner"))
        );
        assert_eq!(
            eval(&o, ".spec.tasks[-1].role").unwrap(),
            Some(json!("learner"))
        );
        assert_eq!(
            eval(&o, ".spec.tasks[*].role").unwrap(),
            Some(json!("actor"))
        );
        let path = JsonPath::parse(".spec.tasks[*].role").unwrap();
        assert_eq!(path.all(&o), vec![&json!("actor"), &json!("learner")]);
        let path = JsonPath::parse(".metadata.labels.*").unwrap();
        assert_eq!(path.all(&o).len(), 2);
    }

    #[test]
    fn filters() {
        let o = object();
        assert_eq!(
            eval(&o, r#".status.conditions[?(@.type=="Ready")].status"#).unwrap(),
            Some(json!("False"))
        );
        assert_eq!(
            eval(&o, ".status.conditions[?(@.type == 'Scheduled')].status").unwrap(),
            Some(json!("True"))
        );
        assert_eq!(
            eval(&o, r#".status.conditions[?(@.type!="Ready")].type"#).unwrap(),
            Some(json!("Scheduled"))
        );
        assert_eq!(
            eval(&o, ".spec.tasks[?(@.replicas==1)].role").unwrap(),
            Some(json!("learner"))
        );
        assert_eq!(
            eval(&o, ".spec.tasks[?(@.replicas)].role").unwrap(),
            Some(json!("actor"))
        );
        assert_eq!(
            eval(&o, r#".status.conditions[?(@.type=="Nope")].status"#).unwrap(),
            None
        );
    }

    #[test]
    fn syntax_errors_and_unsupported() {
        assert_eq!(eval(&object(), ""), Err(JsonPathError::Empty));
        assert_eq!(eval(&object(), "{}"), Err(JsonPathError::Empty));
        assert!(matches!(
            eval(&object(), ".a[0"),
            Err(JsonPathError::Syntax { .. })
        ));
        assert!(matches!(
            eval(&object(), ".a['x"),
            Err(JsonPathError::Syntax { .. })
        ));
        assert!(matches!(
            eval(&object(), "{.a"),
            Err(JsonPathError::Syntax { .. })
        ));
        assert!(matches!(
            eval(&object(), ".a."),
            Err(JsonPathError::Syntax { .. })
        ));
        assert!(matches!(
            eval(&object(), "..a"),
            Err(JsonPathError::Unsupported { .. })
        ));
        assert!(matches!(
            eval(&object(), ".a[0:2]"),
            Err(JsonPathError::Unsupported { .. })
        ));
        assert!(matches!(
            eval(&object(), ".a[?(@.x > 1)]"),
            Err(JsonPathError::Unsupported { .. })
        ));
    }
}

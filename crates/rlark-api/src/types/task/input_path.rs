//! The JSONPath subset of `envFrom.input[].path`: one value of a Task's `spec.input`.
//!
//! Grammar (whitespace is not allowed anywhere):
//!
//! ```text
//! path    = "$" step*
//! step    = "." name | "[" quoted "]" | "[" index "]"
//! name    = 1*( ALPHA / DIGIT / "_" / "-" )          ; a key of an object
//! quoted  = "'" chars "'" | '"' chars '"'            ; any key; \\ \' \" escape
//! index   = "0" | (DIGIT other than 0) *DIGIT         ; an element of an array
//! ```
//!
//! `$` is the whole input; `$.a.b`, `$['a']["b"]` and `$.list[0]` select inside it. There
//! are no wildcards, slices, filters or recursive descent: a path selects at most one
//! value, so it can become one environment variable.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// One step of an [`InputPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InputPathStep {
    /// The value of this key of an object.
    Field(String),
    /// The element at this index of an array.
    Index(usize),
}

/// A parsed path (see the module documentation). `Display` writes the canonical form:
/// `.name` for keys the dot form can carry, `['key']` for the others, `[i]` for indexes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct InputPath {
    steps: Vec<InputPathStep>,
}

/// Why a path does not parse: what was expected, and where (0-based character offset).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} at character {offset}")]
pub struct InputPathError {
    /// Offset of the problem in characters from the start of the path.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl InputPath {
    /// Parse `text` (see the module documentation for the grammar).
    pub fn parse(text: &str) -> Result<InputPath, InputPathError> {
        let chars: Vec<char> = text.chars().collect();
        let fail = |offset: usize, message: &str| InputPathError {
            offset,
            message: message.to_string(),
        };
        if chars.first() != Some(&'$') {
            return Err(fail(0, "a path must start with '$'"));
        }
        let mut steps = Vec::new();
        let mut i = 1;
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    let start = i + 1;
                    let mut end = start;
                    while end < chars.len() && is_name_char(chars[end]) {
                        end += 1;
                    }
                    if end == start {
                        return Err(fail(
                            start,
                            "expected a key after '.' (letters, digits, '_' or '-'; use ['key'] \
                             for other keys)",
                        ));
                    }
                    steps.push(InputPathStep::Field(chars[start..end].iter().collect()));
                    i = end;
                }
                '[' => {
                    let (step, next) = Self::bracket(&chars, i + 1)?;
                    steps.push(step);
                    i = next;
                }
                _ => return Err(fail(i, "expected '.' or '['")),
            }
        }
        Ok(InputPath { steps })
    }

    /// The step in brackets that starts at `i` (just after `[`), and the offset after `]`.
    fn bracket(chars: &[char], i: usize) -> Result<(InputPathStep, usize), InputPathError> {
        let fail = |offset: usize, message: &str| InputPathError {
            offset,
            message: message.to_string(),
        };
        let close = |at: usize| {
            if chars.get(at) == Some(&']') {
                Ok(at + 1)
            } else {
                Err(fail(at, "expected ']'"))
            }
        };
        match chars.get(i) {
            Some(&quote) if quote == '\'' || quote == '"' => {
                let mut key = String::new();
                let mut j = i + 1;
                loop {
                    match chars.get(j) {
                        None => return Err(fail(j, "unterminated quoted key")),
                        Some('\\') => match chars.get(j + 1) {
                            Some(&c) if c == '\\' || c == '\'' || c == '"' => {
                                key.push(c);
                                j += 2;
                            }
                            _ => {
                                return Err(fail(
                                    j,
                                    "unsupported escape (only \\\\, \\' and \\\" are allowed)",
                                ));
                            }
                        },
                        Some(&c) if c == quote => break,
                        Some(&c) => {
                            key.push(c);
                            j += 1;
                        }
                    }
                }
                Ok((InputPathStep::Field(key), close(j + 1)?))
            }
            Some(c) if c.is_ascii_digit() => {
                let mut j = i;
                while chars.get(j).is_some_and(char::is_ascii_digit) {
                    j += 1;
                }
                let digits: String = chars[i..j].iter().collect();
                if digits.len() > 1 && digits.starts_with('0') {
                    return Err(fail(i, "an index must not have leading zeros"));
                }
                let index = digits
                    .parse::<usize>()
                    .map_err(|_| fail(i, "the index is too large"))?;
                Ok((InputPathStep::Index(index), close(j)?))
            }
            Some('-') => Err(fail(i, "an index must not be negative")),
            Some('*') => Err(fail(i, "wildcards are not supported")),
            _ => Err(fail(
                i,
                "expected a quoted key ('key') or an array index after '['",
            )),
        }
    }

    /// The steps after `$`, in order.
    pub fn steps(&self) -> &[InputPathStep] {
        &self.steps
    }

    /// The value the path selects in `input`, or `None` when a step finds nothing (a key
    /// the object lacks, an index past the end, or a step into a value of the other kind).
    pub fn lookup<'a>(&self, input: &'a Value) -> Option<&'a Value> {
        self.steps
            .iter()
            .try_fold(input, |value, step| match (step, value) {
                (InputPathStep::Field(key), Value::Object(map)) => map.get(key),
                (InputPathStep::Index(i), Value::Array(items)) => items.get(*i),
                _ => None,
            })
    }
}

impl FromStr for InputPath {
    type Err = InputPathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InputPath::parse(s)
    }
}

impl fmt::Display for InputPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for step in &self.steps {
            match step {
                InputPathStep::Field(key) if !key.is_empty() && key.chars().all(is_name_char) => {
                    write!(f, ".{key}")?;
                }
                InputPathStep::Field(key) => {
                    let escaped = key.replace('\\', "\\\\").replace('\'', "\\'");
                    write!(f, "['{escaped}']")?;
                }
                InputPathStep::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

/// The environment variable value of an input value: a string as it is, anything else
/// (number, boolean, null, object, array) as compact JSON text.
pub fn input_env_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(k: &str) -> InputPathStep {
        InputPathStep::Field(k.to_string())
    }

    #[test]
    fn the_subset_parses() {
        let cases: &[(&str, Vec<InputPathStep>)] = &[
            ("$", vec![]),
            ("$.a", vec![field("a")]),
            ("$.a_b-1.C", vec![field("a_b-1"), field("C")]),
            ("$['a b']", vec![field("a b")]),
            ("$[\"x.y\"][0]", vec![field("x.y"), InputPathStep::Index(0)]),
            (
                "$.list[12].k",
                vec![field("list"), InputPathStep::Index(12), field("k")],
            ),
            ("$['it\\'s']", vec![field("it's")]),
            ("$['back\\\\slash']", vec![field("back\\slash")]),
            ("$['']", vec![field("")]),
            ("$.0", vec![field("0")]),
        ];
        for (text, steps) in cases {
            let path = InputPath::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(path.steps(), steps.as_slice(), "{text}");
            // The canonical form parses back to the same path.
            let again = InputPath::parse(&path.to_string()).expect("canonical form");
            assert_eq!(again, path, "{text} -> {path}");
        }
        assert_eq!(
            InputPath::parse("$[\"a b\"][3]").unwrap().to_string(),
            "$['a b'][3]"
        );
    }

    #[test]
    fn bad_paths_say_what_and_where() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 0, "must start with '$'"),
            ("a.b", 0, "must start with '$'"),
            ("$.", 2, "expected a key after '.'"),
            ("$..a", 2, "expected a key after '.'"),
            ("$a", 1, "expected '.' or '['"),
            ("$.a b", 3, "expected '.' or '['"),
            ("$[", 2, "expected a quoted key"),
            ("$[*]", 2, "wildcards are not supported"),
            ("$[-1]", 2, "must not be negative"),
            ("$[01]", 2, "leading zeros"),
            ("$[1", 3, "expected ']'"),
            ("$['a'", 5, "expected ']'"),
            ("$['a", 4, "unterminated quoted key"),
            ("$['a\\n']", 4, "unsupported escape"),
            ("$[99999999999999999999999]", 2, "too large"),
            ("$[a]", 2, "expected a quoted key"),
        ];
        for (text, offset, message) in cases {
            let error = InputPath::parse(text).expect_err(text);
            assert_eq!(error.offset, *offset, "{text}: {error}");
            assert!(error.message.contains(message), "{text}: {error}");
            assert!(
                error
                    .to_string()
                    .ends_with(&format!("at character {offset}"))
            );
        }
    }

    #[test]
    fn lookup_finds_one_value_or_nothing() {
        let input = json!({"q": "2+2", "n": 4, "ok": true, "none": null,
                           "list": [{"k": "v"}, 7], "a b": {"c": [1, 2]}});
        let get = |p: &str| InputPath::parse(p).expect(p).lookup(&input).cloned();
        assert_eq!(get("$"), Some(input.clone()));
        assert_eq!(get("$.q"), Some(json!("2+2")));
        assert_eq!(get("$.list[0].k"), Some(json!("v")));
        assert_eq!(get("$.list[1]"), Some(json!(7)));
        assert_eq!(get("$['a b'].c[1]"), Some(json!(2)));
        assert_eq!(get("$.none"), Some(Value::Null));
        assert_eq!(get("$.missing"), None);
        assert_eq!(get("$.list[2]"), None);
        assert_eq!(get("$.list.k"), None, "a key of an array");
        assert_eq!(get("$.q[0]"), None, "an index of a string");
        assert_eq!(get("$[0]"), None, "an index of an object");
    }

    #[test]
    fn values_become_strings() {
        assert_eq!(input_env_value(&json!("as is")), "as is");
        assert_eq!(input_env_value(&json!(4)), "4");
        assert_eq!(input_env_value(&json!(-1.5)), "-1.5");
        assert_eq!(input_env_value(&json!(true)), "true");
        assert_eq!(input_env_value(&Value::Null), "null");
        assert_eq!(
            input_env_value(&json!({"b": 1, "a": [1, "x"]})),
            r#"{"b":1,"a":[1,"x"]}"#
        );
    }
}

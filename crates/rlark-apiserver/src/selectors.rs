//! Label and field selectors, with Kubernetes' grammar and matching rules.
//!
//! Label selectors (`k8s.io/apimachinery/pkg/labels`): comma-separated requirements
//! `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`, `key>n`,
//! `key<n`. `!=` and `notin` also match objects without the label.
//!
//! Field selectors (`k8s.io/apimachinery/pkg/fields`): comma-separated `field=v`,
//! `field==v`, `field!=v`, where `\,`, `\=` and `\\` escape. Supported fields are
//! `metadata.name`, `metadata.namespace` and the kind's `selectableFields`.

use serde_json::Value;

use crate::error::ApiError;
use crate::registry::ResourceType;

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: LabelOp,
    values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelOp {
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    In,
    NotIn,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    Open,
    Close,
    Comma,
}

fn lex(input: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            ',' => tokens.push(Token::Comma),
            '(' => tokens.push(Token::Open),
            ')' => tokens.push(Token::Close),
            '>' => tokens.push(Token::Greater),
            '<' => tokens.push(Token::Less),
            '=' if chars.peek() == Some(&'=') => {
                chars.next();
                tokens.push(Token::DoubleEquals);
            }
            '=' => tokens.push(Token::Equals),
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                tokens.push(Token::NotEquals);
            }
            '!' => tokens.push(Token::Bang),
            c => {
                let mut ident = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || ",()<>=!".contains(next) {
                        break;
                    }
                    ident.push(next);
                    chars.next();
                }
                tokens.push(Token::Ident(ident));
            }
        }
    }
    tokens
}

impl LabelSelector {
    /// Parse; `Err` is a 400 naming the selector and what is wrong with it.
    pub(crate) fn parse(input: &str) -> Result<Self, ApiError> {
        Self::parse_inner(input).map_err(|why| {
            ApiError::bad_request(format!("unable to parse labelSelector {input:?}: {why}"))
        })
    }

    fn parse_inner(input: &str) -> Result<Self, String> {
        let tokens = lex(input);
        let mut requirements = Vec::new();
        let mut pos = 0;
        let next = |pos: &mut usize| {
            let token = tokens.get(*pos).cloned();
            *pos += 1;
            token
        };
        while pos < tokens.len() {
            let requirement = match next(&mut pos) {
                Some(Token::Bang) => match next(&mut pos) {
                    Some(Token::Ident(key)) => Requirement {
                        key,
                        op: LabelOp::DoesNotExist,
                        values: vec![],
                    },
                    other => {
                        return Err(format!("expected a label key after '!', found {other:?}"));
                    }
                },
                Some(Token::Ident(key)) => match tokens.get(pos) {
                    None | Some(Token::Comma) => Requirement {
                        key,
                        op: LabelOp::Exists,
                        values: vec![],
                    },
                    Some(Token::Equals | Token::DoubleEquals | Token::NotEquals) => {
                        let op = if tokens[pos] == Token::NotEquals {
                            LabelOp::NotEquals
                        } else {
                            LabelOp::Equals
                        };
                        pos += 1;
                        // `key=` selects the empty value.
                        let value = match tokens.get(pos) {
                            Some(Token::Ident(value)) => {
                                pos += 1;
                                value.clone()
                            }
                            None | Some(Token::Comma) => String::new(),
                            Some(other) => {
                                return Err(format!(
                                    "expected a value after the operator, found {other:?}"
                                ));
                            }
                        };
                        Requirement {
                            key,
                            op,
                            values: vec![value],
                        }
                    }
                    Some(Token::Greater | Token::Less) => {
                        let op = if tokens[pos] == Token::Greater {
                            LabelOp::GreaterThan
                        } else {
                            LabelOp::LessThan
                        };
                        pos += 1;
                        match next(&mut pos) {
                            Some(Token::Ident(value)) if value.parse::<i64>().is_ok() => {
                                Requirement {
                                    key,
                                    op,
                                    values: vec![value],
                                }
                            }
                            other => {
                                return Err(format!(
                                    "expected an integer after '>' or '<', found {other:?}"
                                ));
                            }
                        }
                    }
                    Some(Token::Ident(word)) if word == "in" || word == "notin" => {
                        let op = if word == "in" {
                            LabelOp::In
                        } else {
                            LabelOp::NotIn
                        };
                        pos += 1;
                        if next(&mut pos) != Some(Token::Open) {
                            return Err(format!("expected '(' after '{word}'"));
                        }
                        let mut values = Vec::new();
                        let mut expect_value = true;
                        loop {
                            match next(&mut pos) {
                                Some(Token::Ident(value)) if expect_value => {
                                    values.push(value);
                                    expect_value = false;
                                }
                                Some(Token::Comma) => {
                                    if expect_value {
                                        values.push(String::new());
                                    }
                                    expect_value = true;
                                }
                                Some(Token::Close) => {
                                    if expect_value && !values.is_empty() {
                                        values.push(String::new());
                                    }
                                    break;
                                }
                                other => return Err(format!("unexpected {other:?} in value list")),
                            }
                        }
                        if values.is_empty() {
                            return Err(format!("'{word}' needs at least one value"));
                        }
                        Requirement { key, op, values }
                    }
                    Some(other) => return Err(format!("unexpected {other:?} after key {key:?}")),
                },
                other => return Err(format!("expected a label key, found {other:?}")),
            };
            if let Err(errors) = rlark_api::names::qualified_name(&requirement.key) {
                return Err(format!("invalid label key {:?}: {errors}", requirement.key));
            }
            if matches!(
                requirement.op,
                LabelOp::Equals | LabelOp::NotEquals | LabelOp::In | LabelOp::NotIn
            ) {
                for value in &requirement.values {
                    if let Err(errors) = rlark_api::names::label_value(value) {
                        return Err(format!("invalid label value {value:?}: {errors}"));
                    }
                }
            }
            requirements.push(requirement);
            match next(&mut pos) {
                None => break,
                Some(Token::Comma) if pos < tokens.len() => {}
                other => {
                    return Err(format!(
                        "expected ',' between requirements, found {other:?}"
                    ));
                }
            }
        }
        Ok(Self { requirements })
    }

    /// Parse an optional selector (absent = match everything).
    pub(crate) fn parse_opt(input: Option<&str>) -> Result<Self, ApiError> {
        input.map_or_else(|| Ok(Self::default()), Self::parse)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `object`'s `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|r| {
            let value = label(&r.key);
            match r.op {
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
                LabelOp::Equals | LabelOp::In => {
                    value.is_some_and(|v| r.values.iter().any(|x| x == v))
                }
                LabelOp::NotEquals | LabelOp::NotIn => {
                    !value.is_some_and(|v| r.values.iter().any(|x| x == v))
                }
                LabelOp::GreaterThan | LabelOp::LessThan => {
                    let (Some(have), Ok(bound)) = (
                        value.and_then(|v| v.parse::<i64>().ok()),
                        r.values[0].parse::<i64>(),
                    ) else {
                        return false;
                    };
                    if r.op == LabelOp::GreaterThan {
                        have > bound
                    } else {
                        have < bound
                    }
                }
            }
        })
    }
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    terms: Vec<FieldTerm>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldTerm {
    /// Dotted path, e.g. `status.phase`.
    field: String,
    equals: bool,
    value: String,
}

/// Split on `sep` outside backslash escapes (escapes are kept for [`unescape`]).
fn split_unescaped(input: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in input.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(&input[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&input[start..]);
    parts
}

fn unescape(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => return Err(format!("invalid escape sequence \\{other}")),
                None => return Err("trailing backslash".to_string()),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parse for `rt`; syntax errors and fields `rt` does not support are 400.
    pub(crate) fn parse(input: &str, rt: &ResourceType) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_unescaped(input, ',') {
            if term.trim().is_empty() {
                continue;
            }
            let invalid = |why: String| {
                ApiError::bad_request(format!("invalid fieldSelector {input:?}: {why}"))
            };
            // The first unescaped operator splits the term, as in Kubernetes' `splitTerm`.
            let mut split = None;
            let mut escaped = false;
            for (i, c) in term.char_indices() {
                if escaped {
                    escaped = false;
                    continue;
                }
                let rest = &term[i..];
                if c == '\\' {
                    escaped = true;
                } else if rest.starts_with("!=") {
                    split = Some((i, 2, false));
                } else if rest.starts_with("==") {
                    split = Some((i, 2, true));
                } else if c == '=' {
                    split = Some((i, 1, true));
                }
                if split.is_some() {
                    break;
                }
            }
            let Some((at, len, equals)) = split else {
                return Err(invalid(format!("{term:?} has no operator")));
            };
            let field = term[..at].trim().to_string();
            let value = unescape(&term[at + len..]).map_err(invalid)?;
            let supported = field == "metadata.name"
                || field == "metadata.namespace"
                || rt.selectable_fields.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push(FieldTerm {
                field,
                equals,
                value,
            });
        }
        Ok(Self { terms })
    }

    /// Parse an optional selector (absent = match everything).
    pub(crate) fn parse_opt(input: Option<&str>, rt: &ResourceType) -> Result<Self, ApiError> {
        input.map_or_else(|| Ok(Self::default()), |s| Self::parse(s, rt))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether every term holds. A missing field compares as the empty string, and numbers
    /// and booleans compare in their JSON spelling (as for CRD selectable fields).
    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|term| {
            let pointer = format!("/{}", term.field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == term.value) == term.equals
        })
    }

    /// The name an `metadata.name=X` term pins the selection to, if any (single-object
    /// watches, `kubectl get NAME -w`).
    #[cfg(test)]
    pub(crate) fn name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == "metadata.name" && t.equals)
            .map(|t| t.value.as_str())
    }

    /// Add the term `metadata.name=name` (a watch on an object URL).
    pub(crate) fn require_name(&mut self, name: &str) {
        self.terms.push(FieldTerm {
            field: "metadata.name".into(),
            equals: true,
            value: name.into(),
        });
    }
}

/// Both selectors of a list or watch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub(crate) fn parse(
        labels: Option<&str>,
        fields: Option<&str>,
        rt: &ResourceType,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            labels: LabelSelector::parse_opt(labels)?,
            fields: FieldSelector::parse_opt(fields, rt)?,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns", "labels": labels}, "status": {"phase": "Running", "replicas": 2}})
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        assert!(sel("").matches(&o));
        assert!(sel("app=web").matches(&o));
        assert!(sel("app==web,tier=front").matches(&o));
        assert!(!sel("app=db").matches(&o));
        assert!(sel("app!=db").matches(&o));
        assert!(sel("missing!=x").matches(&o), "!= matches absent labels");
        assert!(sel("app in (db, web)").matches(&o));
        assert!(!sel("app notin (db,web)").matches(&o));
        assert!(sel("missing notin (x)").matches(&o));
        assert!(sel("app").matches(&o));
        assert!(!sel("!app").matches(&o));
        assert!(sel("!missing").matches(&o));
        assert!(sel("n>4,n<6").matches(&o));
        assert!(!sel("n>5").matches(&o));
        assert!(
            sel("rlinf.io/job in (a),  app").matches(&obj(json!({"rlinf.io/job": "a", "app": ""})))
        );
        assert!(sel("app=").matches(&obj(json!({"app": ""}))));
        assert!(!sel("app=web").matches(&json!({"metadata": {}})));
    }

    #[test]
    fn label_parse_errors_name_the_selector() {
        for bad in [
            "app in web",
            "app in (",
            "=x",
            "app=web,",
            "app,,b",
            "a b",
            "app=-bad-",
            "Bad Key=x",
            "n>x",
            "app in ()",
        ] {
            let error = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(error.code, 400, "{bad}");
            assert!(
                error.message.contains(&format!("{bad:?}")),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn field_selectors() {
        let rt = ResourceType::namespace();
        let o = obj(json!({}));
        let f = |s: &str| FieldSelector::parse(s, &rt).unwrap();
        assert!(f("metadata.name=n1").matches(&o));
        assert!(f("metadata.name==n1,metadata.namespace=ns").matches(&o));
        assert!(f("status.phase!=Pending").matches(&o));
        assert!(!f("status.phase=Pending").matches(&o));
        assert_eq!(f("metadata.name=n1").name(), Some("n1"));
        assert!(f("").is_empty());
        let escaped = f(r"metadata.name=a\,b\=c\\");
        assert!(escaped.matches(&json!({"metadata": {"name": r"a,b=c\"}})));
        let error = FieldSelector::parse("spec.x=1", &rt).unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            (400, "field label not supported: spec.x")
        );
        assert_eq!(
            FieldSelector::parse("metadata.name", &rt).unwrap_err().code,
            400
        );
        assert_eq!(
            FieldSelector::parse(r"metadata.name=a\x", &rt)
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn selectable_fields_of_crds_are_supported() {
        let registry = crate::registry::Registry::builtin();
        for rt in registry.all() {
            for field in &rt.selectable_fields {
                assert!(
                    FieldSelector::parse(&format!("{field}=x"), rt).is_ok(),
                    "{field}"
                );
            }
        }
    }
}

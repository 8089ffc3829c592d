//! `rlark get -o FORMAT`: the formats, and how objects print in each outside a table.

use std::io::Write as _;

use anyhow::Context as _;
use serde_json::Value;

use crate::output::{CustomColumns, Template};

#[derive(Clone, Debug)]
pub(crate) enum OutputFormat {
    Yaml,
    Json,
    Wide,
    Name,
    JsonPath(Template),
    CustomColumns(CustomColumns),
}

/// `-o FORMAT`: a name, or `jsonpath=` / `custom-columns=` with their argument.
pub(crate) fn parse_output(value: &str) -> Result<OutputFormat, String> {
    match value {
        "yaml" => return Ok(OutputFormat::Yaml),
        "json" => return Ok(OutputFormat::Json),
        "wide" => return Ok(OutputFormat::Wide),
        "name" => return Ok(OutputFormat::Name),
        _ => {}
    }
    if let Some(template) = value.strip_prefix("jsonpath=") {
        return Template::parse(template)
            .map(OutputFormat::JsonPath)
            .map_err(|e| e.to_string());
    }
    if let Some(spec) = value.strip_prefix("custom-columns=") {
        return CustomColumns::parse(spec)
            .map(OutputFormat::CustomColumns)
            .map_err(|e| e.to_string());
    }
    Err("one of yaml, json, wide, name, jsonpath=TEMPLATE, custom-columns=SPEC".to_string())
}

/// A whole document (an object or a `List`) in `format`: JSON, YAML or a jsonpath
/// template (`-o name` and custom columns print objects, see [`ObjectPrinter`]).
pub(crate) fn print_document(document: &Value, format: &OutputFormat) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => format!("{}\n", serde_json::to_string_pretty(document)?),
        // As kubectl: no newline of its own (templates end with `{"\n"}`).
        OutputFormat::JsonPath(template) => template.render(document),
        _ => yaml(document)?,
    };
    write_stdout(&text)
}

fn yaml(document: &Value) -> anyhow::Result<String> {
    let text = serde_saphyr::to_string(document).context("render YAML")?;
    Ok(text.trim_start_matches("---\n").to_string())
}

pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("write to stdout")
}

/// Objects printed one after the other, as `kubectl get -w -o FORMAT` prints its events:
/// a JSON document each, YAML documents separated by `---`, a `kind.group/name` line each,
/// the template applied to each, or a custom-columns row each (the header once).
pub(crate) struct ObjectPrinter<'a> {
    format: &'a OutputFormat,
    no_headers: bool,
    printed: usize,
}

impl<'a> ObjectPrinter<'a> {
    pub(crate) fn new(format: &'a OutputFormat, no_headers: bool) -> Self {
        ObjectPrinter {
            format,
            no_headers,
            printed: 0,
        }
    }

    /// Print `object`, an object of kind `qualified_kind` (`job.rlinf.io`).
    pub(crate) fn print(&mut self, qualified_kind: &str, object: &Value) -> anyhow::Result<()> {
        let text = match self.format {
            OutputFormat::Name => format!("{}\n", object_name(qualified_kind, object)),
            OutputFormat::CustomColumns(columns) => columns.render(
                std::slice::from_ref(object),
                self.no_headers || self.printed > 0,
            ),
            OutputFormat::Yaml if self.printed > 0 => format!("---\n{}", yaml(object)?),
            OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => {
                self.printed += 1;
                return print_document(object, self.format);
            }
            OutputFormat::Wide => unreachable!("-o wide prints table rows"),
        };
        self.printed += 1;
        write_stdout(&text)
    }
}

/// `kind.group/name`, as `-o name` prints an object.
pub(crate) fn object_name(qualified_kind: &str, object: &Value) -> String {
    format!(
        "{qualified_kind}/{}",
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_or_with_their_argument() {
        assert!(matches!(parse_output("yaml"), Ok(OutputFormat::Yaml)));
        assert!(matches!(parse_output("name"), Ok(OutputFormat::Name)));
        assert!(matches!(
            parse_output("jsonpath={.kind}"),
            Ok(OutputFormat::JsonPath(_))
        ));
        assert!(matches!(
            parse_output("custom-columns=N:.metadata.name"),
            Ok(OutputFormat::CustomColumns(_))
        ));
        assert!(parse_output("table").is_err());
    }

    #[test]
    fn names_are_kind_qualified() {
        let object = serde_json::json!({"metadata": {"name": "ppo"}});
        assert_eq!(object_name("job.rlinf.io", &object), "job.rlinf.io/ppo");
    }
}

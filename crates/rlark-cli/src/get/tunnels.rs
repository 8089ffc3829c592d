//! `rlark get tunnels`: the agent sessions of the server the kubeconfig points at (live
//! state of the server's hub, not stored objects: `/api/v1/tunnels`).

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::GetArgs;
use super::format::{OutputFormat, print_document};
use crate::client::{Session, format_status};

/// The tunnels (all, or those of the agents `names`) in the format of `args`.
pub(crate) async fn print(
    session: &Session,
    args: &GetArgs,
    names: &[String],
) -> anyhow::Result<()> {
    let request = http::Request::get("/api/v1/tunnels")
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .context("build request")?;
    let list: Value = match session.client.request(request).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) => bail!("{}", format_status(&status)),
        Err(e) => return Err(e).context("GET /api/v1/tunnels"),
    };
    let mut items: Vec<&Value> = list["items"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if !names.is_empty() {
        items.retain(|t| names.iter().any(|n| t["clusterID"].as_str() == Some(n)));
    }
    match &args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_))) => {
            print_document(&list, format)?;
        }
        Some(OutputFormat::CustomColumns(columns)) => {
            let items: Vec<Value> = items.into_iter().cloned().collect();
            print!("{}", columns.render(&items, args.no_headers));
        }
        Some(OutputFormat::Name) => {
            for t in items {
                println!("tunnel/{}", t["clusterID"].as_str().unwrap_or_default());
            }
        }
        None | Some(OutputFormat::Wide) => {
            let mut rows = Vec::new();
            if !args.no_headers {
                rows.push(
                    [
                        "AGENT",
                        "NODE",
                        "REPLICA",
                        "REMOTE",
                        "SINCE",
                        "STREAMS",
                        "BYTES-IN",
                        "BYTES-OUT",
                        "RTT",
                    ]
                    .map(String::from)
                    .to_vec(),
                );
            }
            for t in &items {
                let text = |f: &str| t[f].as_str().unwrap_or("<none>").to_string();
                let num = |f: &str| t[f].as_u64().unwrap_or(0).to_string();
                rows.push(vec![
                    text("clusterID"),
                    text("node"),
                    text("replica"),
                    text("remote"),
                    text("connectedSince"),
                    num("streamsOpen"),
                    num("bytesIn"),
                    num("bytesOut"),
                    t["minRttMicros"]
                        .as_u64()
                        .map_or("<none>".to_string(), |us| {
                            format!("{:.2}ms", us as f64 / 1000.0)
                        }),
                ]);
            }
            if items.is_empty() {
                eprintln!("No tunnels connected to this server.");
            }
            let widths: Vec<usize> = (0..9)
                .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
                .collect();
            for row in rows {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(cell, w)| format!("{cell:<w$}"))
                    .collect();
                println!("{}", line.join("   ").trim_end());
            }
        }
    }
    Ok(())
}

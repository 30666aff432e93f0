//! `space mcp`: a Model Context Protocol server whose tools drive sessions through the space
//! HTTP API (any server: `--url`, `--api-key`). Stdio by default, for MCP clients that start
//! it; streamable HTTP with `--listen`. See docs/mcp.md.

mod api;
mod http;
mod params;
mod results;
mod tools;

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;
use rmcp::ServiceExt;

use crate::client::Client;

#[derive(Args)]
pub struct McpArgs {
    /// Serve MCP over streamable HTTP at http://ADDR/mcp instead of stdio. ADDR is HOST:PORT
    /// or a port (on 127.0.0.1). Whoever reaches it acts with your API key: keep it local.
    #[arg(long, value_name = "ADDR", value_parser = http::parse_listen)]
    listen: Option<SocketAddr>,
    /// With --listen: require `Authorization: Bearer TOKEN` on every HTTP request.
    #[arg(long, env = "SPACE_MCP_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    auth_token: Option<String>,
    /// With --listen: allow a non-loopback address and any Host header (needs --auth-token;
    /// put TLS in front of it).
    #[arg(long)]
    allow_remote: bool,
}

pub async fn run(client: &Client, args: McpArgs) -> anyhow::Result<()> {
    let api = api::SpaceApi::new(client.clone());
    match args.listen {
        Some(addr) => {
            let options = http::HttpOptions { addr, token: args.auth_token, allow_remote: args.allow_remote };
            http::serve(api, options).await
        }
        None => {
            // Stdout carries the protocol: nothing else may be printed there.
            let service = tools::SpaceTools::new(api)
                .serve(rmcp::transport::stdio())
                .await
                .context("starting the MCP server on stdio")?;
            service.waiting().await.context("serving MCP on stdio")?;
            Ok(())
        }
    }
}

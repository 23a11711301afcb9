//! `tollgate tenants` and `tollgate keys`: the directory of a running server (tenants and
//! the keys that act for them), changed through its admin endpoints and kept in its store.

use std::process::ExitCode;

/// Which server to ask, and as whom.
#[derive(clap::Args)]
pub struct Server {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    server: String,
    /// An admin key of that server.
    #[arg(long, env = "TOLLGATE_ADMIN_KEY")]
    key: String,
}

impl Server {
    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let url = format!("{}{path}", self.server.trim_end_matches('/'));
        ureq::request(method, &url).set("Authorization", &format!("Bearer {}", self.key))
    }
}

#[derive(clap::Subcommand)]
pub enum TenantsCommand {
    /// Every tenant, as written and with the defaults applied.
    List {
        #[command(flatten)]
        server: Server,
    },
    /// One tenant.
    Get {
        name: String,
        #[command(flatten)]
        server: Server,
    },
    /// Create or change a tenant from its settings as JSON (as under `tenants` in the file; `-` reads standard input).
    Put {
        name: String,
        settings: String,
        #[command(flatten)]
        server: Server,
    },
    /// Delete a tenant (refused while it has work in flight) and revoke its caller keys.
    Delete {
        name: String,
        #[command(flatten)]
        server: Server,
    },
}

#[derive(clap::Subcommand)]
pub enum KeysCommand {
    /// Make a key and print it with its id; the key is shown this once.
    Create {
        /// caller, worker or admin.
        #[arg(long)]
        role: String,
        /// The tenant a caller key acts for.
        #[arg(long)]
        tenant: Option<String>,
        /// A worker key's name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        server: Server,
    },
    /// Every key's id, role and tenant or worker name.
    List {
        #[command(flatten)]
        server: Server,
    },
    /// Revoke a key by id.
    Revoke {
        id: String,
        #[command(flatten)]
        server: Server,
    },
}

/// A path segment, percent-encoded.
fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn tenants(command: TenantsCommand) -> Result<ExitCode, String> {
    match command {
        TenantsCommand::List { server } => {
            answer(server.request("GET", "/v1/admin/tenants").call())
        }
        TenantsCommand::Get { name, server } => answer(
            server
                .request("GET", &format!("/v1/admin/tenants/{}", segment(&name)))
                .call(),
        ),
        TenantsCommand::Put {
            name,
            settings,
            server,
        } => {
            let settings = if settings == "-" {
                std::io::read_to_string(std::io::stdin()).map_err(|e| e.to_string())?
            } else {
                settings
            };
            answer(
                server
                    .request("PUT", &format!("/v1/admin/tenants/{}", segment(&name)))
                    .set("Content-Type", "application/json")
                    .send_string(&settings),
            )
        }
        TenantsCommand::Delete { name, server } => answer(
            server
                .request("DELETE", &format!("/v1/admin/tenants/{}", segment(&name)))
                .call(),
        ),
    }
}

pub fn keys(command: KeysCommand) -> Result<ExitCode, String> {
    match command {
        KeysCommand::Create {
            role,
            tenant,
            name,
            server,
        } => {
            let mut body = serde_json::json!({ "role": role });
            if let Some(t) = tenant {
                body["tenant"] = t.into();
            }
            if let Some(n) = name {
                body["name"] = n.into();
            }
            answer(
                server
                    .request("POST", "/v1/admin/keys")
                    .set("Content-Type", "application/json")
                    .send_string(&body.to_string()),
            )
        }
        KeysCommand::List { server } => answer(server.request("GET", "/v1/admin/keys").call()),
        KeysCommand::Revoke { id, server } => answer(
            server
                .request("DELETE", &format!("/v1/admin/keys/{}", segment(&id)))
                .call(),
        ),
    }
}

/// Prints the server's answer; a refusal prints its status too and fails.
pub fn answer(response: Result<ureq::Response, ureq::Error>) -> Result<ExitCode, String> {
    match response {
        Ok(r) => {
            println!("{}", r.into_string().unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Err(ureq::Error::Status(code, r)) => {
            println!("{code} {}", r.into_string().unwrap_or_default());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.to_string()),
    }
}

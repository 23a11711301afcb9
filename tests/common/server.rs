//! A real `tollgate serve` process for a test: started on a free loopback port, called
//! with a real HTTP client, stopped with SIGTERM (or killed when dropped).

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Server {
    /// `config` written to `dir/config.json`, the store in `dir/state.db`.
    pub fn start(dir: &Path, config: &Value) -> Server {
        Server::start_with(dir, config, &[])
    }

    /// As [`Server::start`], with more arguments for `serve`.
    pub fn start_with(dir: &Path, config: &Value, extra: &[&str]) -> Server {
        let db = dir.join("state.db");
        Server::start_on(dir, "config", config, db.to_str().unwrap(), extra)
    }

    /// `config` written to `dir/<name>.json`, on the store `db` (a file or a URL).
    pub fn start_on(dir: &Path, name: &str, config: &Value, db: &str, extra: &[&str]) -> Server {
        let config_path = dir.join(format!("{name}.json"));
        std::fs::write(&config_path, config.to_string()).unwrap();
        let (child, base) = super::spawn_serve(
            &[
                ["--config", config_path.to_str().unwrap(), "--db", db].as_slice(),
                extra,
            ]
            .concat(),
        );
        Server { child, base }
    }

    /// `config` written to `dir/config.json`, on the store `db`, started by the command
    /// `launch` makes from the executable's path (an environment, a log file, a shell that
    /// lowers a limit first).
    pub fn start_via(
        dir: &Path,
        config: &Value,
        db: &Path,
        launch: impl FnOnce(&str) -> Command,
    ) -> Server {
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let args = [
            "--config",
            config_path.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ];
        let (child, base) = super::spawn_serve_via(&args, launch);
        Server { child, base }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "server did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Option<String>, Value) {
        let mut req = ureq::request(method, &format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let result = match body {
            Some(b) => req.send_string(b),
            None => req.call(),
        };
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = response.status();
        let retry_after = response.header("Retry-After").map(str::to_string);
        let text = response.into_string().unwrap();
        (
            status,
            retry_after,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub fn admit(&self, key: &str, body: Value) -> (u16, Option<String>, Value) {
        self.call("POST", "/v1/admit", Some(key), Some(&body.to_string()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs `body` with `key` to `base` + `path`: the status and the JSON answer.
pub fn post(base: &str, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .send_string(&body.to_string());
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let status = r.status();
    (
        status,
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

/// Milliseconds since the Unix epoch (deadlines over HTTP are wall-clock times).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// CPU time (user + system, in clock ticks) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

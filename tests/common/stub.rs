//! The gateway tests' stub upstreams (tests/gateway/stub_upstream.py, and
//! limited_upstream.py, which enforces a request limit of its own) as processes of their
//! own, on free loopback ports; each stops with the test.

use serde_json::Value;

pub struct Stub {
    child: std::process::Child,
    pub port: u16,
}

impl Stub {
    pub fn start() -> Stub {
        Self::run("stub_upstream.py", "0")
    }

    /// A stub that takes `rpm` requests a minute and refuses more with OpenAI's 429.
    pub fn limited(rpm: u32) -> Stub {
        Self::run("limited_upstream.py", &rpm.to_string())
    }

    /// What a limited stub counted: `served`, `refused`, ...
    pub fn stats(&self) -> Value {
        let text = ureq::get(&format!("http://127.0.0.1:{}/_stats", self.port))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn run(file: &str, arg: &str) -> Stub {
        use std::io::BufRead;
        let script = format!("{}/../tests/gateway/{file}", env!("CARGO_MANIFEST_DIR"));
        let mut child = std::process::Command::new("python3")
            .args([script.as_str(), arg])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the stub prints its port");
        Stub { child, port }
    }

    /// Its base URL, as a gateway upstream names it.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The requests it received whose last message is `content`.
    pub fn calls(&self, content: &str) -> Vec<Value> {
        let text = ureq::get(&format!("http://127.0.0.1:{}/_calls", self.port))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let calls: Vec<Value> = serde_json::from_str(&text).unwrap();
        calls
            .into_iter()
            .filter(|c| c["body"]["messages"][0]["content"] == content)
            .collect()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

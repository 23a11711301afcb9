//! A PostgreSQL database of its own for one test, on the server `.ci/run` starts
//! (`TOLLGATE_TEST_POSTGRES`, a superuser URL), dropped when the test ends.

/// The server's URL, as `.ci/run` gives it.
pub fn server_url() -> String {
    std::env::var("TOLLGATE_TEST_POSTGRES")
        .expect("TOLLGATE_TEST_POSTGRES names a PostgreSQL superuser URL")
}

/// A database created for one test; dropped (with its connections) when this is.
pub struct Database {
    admin_url: String,
    name: String,
}

impl Database {
    /// Creates `tollgate_<tag>_<pid>`, dropping a leftover of that name first.
    pub fn create(tag: &str) -> Database {
        let admin_url = server_url();
        let name = format!("tollgate_{tag}_{}", std::process::id());
        let mut c = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        Database { admin_url, name }
    }

    /// Its URL: the server's, naming this database.
    pub fn url(&self) -> String {
        let (base, _) = self.admin_url.rsplit_once('/').unwrap();
        format!("{base}/{}", self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin_url, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

//! A throwaway PostgreSQL server for tests and benches: a fresh cluster
//! (`initdb`) in a temporary folder, started (`pg_ctl`) on a free loopback
//! port with trust authentication, and stopped and removed when dropped,
//! also when the test fails. The real server of Debian's `postgresql`
//! package, never a mock.
//!
//! PostgreSQL refuses to run as root: under root, the server runs as the
//! package's `postgres` user (through `runuser`), in a folder it owns.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The user the cluster is created for; tests connect as it.
const SUPERUSER: &str = "fanfold";

pub struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// The user the server runs as, when the tests run as root.
    run_as: Option<String>,
    /// The server's options (`pg_ctl -o`), to start it again after a stop.
    options: String,
}

/// The folder of PostgreSQL's server programs: `FANFOLD_PG_BIN`, or the
/// newest `/usr/lib/postgresql/N/bin` holding `initdb`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("FANFOLD_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| {
            format!(
                "no PostgreSQL server here ({}: {e}); `bash scripts/setup.sh` installs Debian's postgresql",
                root.display()
            )
        })?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        format!(
            "no initdb under {}; `bash scripts/setup.sh` installs Debian's postgresql",
            root.display()
        )
    })
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

fn checked(what: &str, out: std::io::Result<Output>) -> Result<Output, String> {
    let out = out.map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

impl Postgres {
    /// Creates and starts a new cluster. An error says what is missing or
    /// what the server said.
    pub fn start() -> Result<Postgres, String> {
        Postgres::start_with(false)
    }

    /// [`Postgres::start`], with TLS on: a throwaway CA (its certificate
    /// at [`Postgres::ca_file`]) signs the server's certificate for
    /// `127.0.0.1` and `localhost`.
    pub fn start_tls() -> Result<Postgres, String> {
        Postgres::start_with(true)
    }

    /// The CA certificate a TLS server's certificate was signed with.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn start_with(tls: bool) -> Result<Postgres, String> {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let bin = bin_dir()?;
        let run_as = is_root().then(|| "postgres".to_owned());
        let dir = std::env::temp_dir().join(format!(
            "fanfold-pg-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut server = Postgres {
            dir,
            bin,
            port: 0,
            run_as,
            options: String::new(),
        };
        if let Some(user) = &server.run_as {
            checked(
                "chown",
                Command::new("chown")
                    .arg(format!("{user}:"))
                    .arg(&server.dir)
                    .output(),
            )?;
        }
        let data = server.data();
        checked(
            "initdb",
            server
                .command("initdb")
                .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
                .arg("--no-sync")
                .arg("-D")
                .arg(&data)
                .output(),
        )?;
        let tls_options = if tls {
            server.certificates()?
        } else {
            String::new()
        };
        // The port is free when asked and may be taken before the server
        // binds it: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            let options = format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
                 -c max_connections=200 -c fsync=off -c synchronous_commit=off \
                 -c full_page_writes=off{tls_options}",
                server.port
            );
            server.options = options;
            match server.start_server() {
                Ok(_) => return Ok(server),
                Err(e) => last = format!("{e}\n{}", server.log()),
            }
        }
        Err(last)
    }

    /// Makes a CA and a server certificate it signs (P-256 keys, valid two
    /// days) with `openssl`, gives the server's key to the server's user;
    /// the options that turn TLS on.
    fn certificates(&self) -> Result<String, String> {
        let dir = &self.dir;
        let openssl = |what: &str, args: &[&str]| {
            checked(
                what,
                Command::new("openssl").current_dir(dir).args(args).output(),
            )
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            "openssl: the CA",
            &[
                &["req", "-x509", "-days", "2", "-subj", "/CN=fanfold test CA"],
                &ec[..],
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
        )?;
        openssl(
            "openssl: the server's request",
            &[
                &["req", "-subj", "/CN=localhost"],
                &ec[..],
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        )?;
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(|e| format!("server.ext: {e}"))?;
        openssl(
            "openssl: the server's certificate",
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        )?;
        if let Some(user) = &self.run_as {
            checked(
                "chown",
                Command::new("chown")
                    .arg(format!("{user}:"))
                    .arg(dir.join("server.key"))
                    .arg(dir.join("server.crt"))
                    .output(),
            )?;
        }
        checked(
            "chmod",
            Command::new("chmod")
                .arg("600")
                .arg(dir.join("server.key"))
                .output(),
        )?;
        Ok(format!(
            " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            dir.join("server.crt").display(),
            dir.join("server.key").display()
        ))
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn start_server(&self) -> Result<Output, String> {
        checked(
            "pg_ctl start",
            self.command("pg_ctl")
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(self.data())
                .arg("-l")
                .arg(self.dir.join("server.log"))
                .args(["-o", &self.options])
                .output(),
        )
    }

    /// Shuts the server down (a fast shutdown: every open connection is
    /// dropped) and leaves it down, as an outage does, until
    /// [`Postgres::start_again`].
    pub fn stop(&self) -> Result<(), String> {
        checked(
            "pg_ctl stop",
            self.command("pg_ctl")
                .args(["stop", "-w", "-m", "fast", "-D"])
                .arg(self.data())
                .output(),
        )
        .map(|_| ())
    }

    /// Starts a server that was stopped, on its port, with its databases.
    pub fn start_again(&self) -> Result<(), String> {
        self.start_server()
            .map(|_| ())
            .map_err(|e| format!("{e}\n{}", self.log()))
    }

    /// Restarts the server (a fast shutdown, as for a failover or an
    /// upgrade): every open connection is dropped.
    pub fn restart(&self) -> Result<(), String> {
        checked(
            "pg_ctl restart",
            self.command("pg_ctl")
                .args(["restart", "-w", "-m", "fast", "-D"])
                .arg(self.data())
                .arg("-l")
                .arg(self.dir.join("server.log"))
                .output(),
        )
        .map(|_| ())
    }

    /// The server's log so far (for a failure's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a new, empty database; its address.
    pub fn create_database(&self) -> Result<String, String> {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let name = format!("store{}", SERIAL.fetch_add(1, Ordering::Relaxed));
        checked(
            "createdb",
            Command::new(self.bin.join("createdb"))
                .args(["-h", "127.0.0.1", "-U", SUPERUSER, "-p"])
                .arg(self.port.to_string())
                .arg(&name)
                .output(),
        )?;
        Ok(self.url(&name))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

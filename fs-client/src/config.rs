//! The client's configuration.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use transport::{Backend, TransportConfig};

/// Everything a mount (or a `Client` library user) can tune.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// Address of the metadata server (`host:port`), or several, comma-separated (a
    /// server and its standbys on one etcd): the first that answers is used, and the
    /// next when it stops answering.
    pub meta_addr: String,
    /// Transport backend.
    pub transport: Backend,
    /// Transport limits and timeouts.
    pub transport_limits: TransportConfig,
    /// How long the kernel may cache attributes, in milliseconds.
    pub attr_ttl_ms: u64,
    /// How long the kernel may cache name lookups, in milliseconds; also how long the
    /// mount trusts its list of every name of a directory it made or listed whole
    /// (`dirnames.rs`).
    pub entry_ttl_ms: u64,
    /// Registered I/O buffers in the pool (bounds the bytes in flight to data servers).
    pub io_buffers: usize,
    /// Size of each registered I/O buffer; also the largest FUSE read and write.
    pub io_buffer_bytes: usize,
    /// Size of one readahead or write-behind buffer (a registered region), in bytes: the
    /// unit files are prefetched and written back in, aligned in the file. A power of two
    /// from `io_buffer_bytes` to 64 MiB.
    pub segment_bytes: usize,
    /// Largest readahead window of one open file, in bytes: prefetching starts at one
    /// segment once reads are sequential and doubles per segment read, up to this.
    /// 0: no prefetching (every read asks the data servers for just its range).
    pub readahead_max_bytes: u64,
    /// Registered memory for prefetched segments of the whole mount, in bytes. When it
    /// is in use, reads go straight to the data servers instead.
    pub readahead_mount_bytes: u64,
    /// Bytes of one file that may be buffered or in flight to data servers before its
    /// writers wait, per handle open for writing (several processes writing one file
    /// get this much each), within `write_buffer_mount_bytes`. 0: no write buffering
    /// (each write reaches the data servers before it returns).
    pub write_buffer_file_bytes: u64,
    /// Registered memory for buffered writes of the whole mount, in bytes; writers wait
    /// while it is in use.
    pub write_buffer_mount_bytes: u64,
    /// How long small `O_APPEND` writes wait in a file's append queue before they are
    /// placed at the end of the file (one reservation for the batch), in milliseconds:
    /// how late a lone append becomes visible to other mounts. 0: each append is placed
    /// when it is made, as with `write_buffer_file_bytes = 0`.
    pub append_linger_ms: u64,
    /// The kernel's readahead for the mount (`read_ahead_kb` of its backing device), in
    /// bytes: how far ahead of a sequential reader the kernel asks, in requests of
    /// `io_buffer_bytes` that are served in parallel. Set when the mount starts, as root.
    pub kernel_readahead_bytes: u64,
    /// Let the kernel cache writes in its page cache and send them later
    /// (`FUSE_WRITEBACK_CACHE`). The kernel then keeps its own length and mtime of files
    /// this mount writes and stops taking them from the server, so a file grown by
    /// another mount can show its old length here: off unless one mount owns the files.
    pub writeback_cache: bool,
    /// POSIX ACLs in the kernel (`FUSE_POSIX_ACL`): it checks access with each file's
    /// ACL as the metadata server does. Off (`-o noacl`), the kernel judges by the mode
    /// bits alone and the server by the ACLs, so a request needs both to allow it (a
    /// user named in an ACL is refused here); new inodes still get their directory's
    /// default ACL from the server, but applied to bits the kernel already took the
    /// umask from (stricter than Linux, which ignores the umask there).
    pub acl: bool,
    /// FUSE event loops (threads reading `/dev/fuse`).
    pub fuse_threads: usize,
    /// Let users other than the mounting one use the mount (`allow_other`).
    pub allow_other: bool,
    /// Honour device nodes: opening one reaches the device (`dev`). Off by default
    /// (`nodev`): anyone root on some client could make a node of a disk here.
    /// `tessera mount -o dev` sets it too.
    pub dev: bool,
    /// Honour the setuid and setgid bits of programs run from the mount (`suid`). Off
    /// by default (`nosuid`): a client names its users itself, so a file's owner is
    /// that client's word. `tessera mount -o suid` sets it too.
    pub suid: bool,
    /// How long a read, write, fsync or truncation keeps retrying while a data server is
    /// unreachable, waiting for the metadata server to take it out of its chains (its
    /// `node_lease_ms` plus a heartbeat), in milliseconds.
    pub failover_timeout_ms: u64,
    /// How long a metadata call waits for an unreachable metadata server to come back
    /// (a restart, a broken connection) before failing with EIO, in milliseconds; 0: no
    /// waiting (one more try at once, on a new connection). Meanwhile open files keep reading and writing, and `fstat` of an open
    /// file answers with what the client knows of it.
    pub meta_wait_ms: u64,
    /// Take early replies: the metadata server may answer a create, mkdir, mknod,
    /// symlink, unlink, rmdir, a written file's length commit or an attribute change (not
    /// a truncation) before its log holds it, and this client keeps the
    /// change until a later reply says it is durable, sends it again if the server
    /// restarted before, and waits for it at `fsync` (and settles what it kept a second or
    /// more). Off: each
    /// such change waits for the server's log.
    pub early_replies: bool,
    /// Answer an unlink the server cannot refuse before the server has it, and send it
    /// at once (`rm -r` and two processes removing in one directory wait for no round
    /// trip per name); calls that could see the name or its inode wait for the reply,
    /// `fsync` of the directory too, and reports a refusal. Off: every unlink waits for
    /// its reply. See `client::removes`.
    pub defer_removes: bool,
    /// When reads move the access time: `relatime` (when it is older than the last
    /// change, or a day old, as ext4 by default), `noatime` (never) or `strictatime`
    /// (at every open that reads, and every listing). `tessera mount -o` sets it too.
    pub atime: AtimeMode,
    /// This client's key file (one line naming the client, its key id, capabilities
    /// and key; mode 0600; `tessera key create --out` writes one, `tessera up` the
    /// administrator's). Empty: connect without authenticating, which only a server
    /// without keys accepts.
    pub key_file: PathBuf,
    /// The name the key was created under (`tessera key create NAME`); empty: the key
    /// file's. Checked against the key file's name.
    pub client_name: String,
    /// The directory of the namespace the mount shows as its root (`META:/path` in
    /// `mount -t fuse.tessera`), below the scope's root for a scoped key. A
    /// convenience, not a boundary: a key scoped to the directory (`tessera key create
    /// --path`) is what keeps a client inside.
    pub subdir: String,
    /// Mount read-only (`ro`): the kernel refuses every change with EROFS.
    pub read_only: bool,
    /// Let programs on the mount be run (`exec`, the default; `noexec` clears it).
    pub exec: bool,
    /// The mount's source as `/proc/mounts` and `df` show it (`mount -a` compares it
    /// with fstab's to know what is mounted already).
    pub fsname: String,
    /// The mount's Prometheus endpoint (off unless `metrics.listen` is set; a library
    /// user serves `Client::metrics` itself).
    pub metrics: telemetry::MetricsConfig,
}

/// The mount's access-time option (see [`ClientConfig::atime`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtimeMode {
    /// Reads never move the access time.
    #[serde(rename = "noatime")]
    NoAtime,
    /// A read moves it when it is not newer than the last change, or is a day old.
    #[default]
    #[serde(rename = "relatime")]
    RelAtime,
    /// Every open that reads, and every listing, moves it.
    #[serde(rename = "strictatime")]
    StrictAtime,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            meta_addr: "127.0.0.1:7600".into(),
            transport: Backend::Tcp,
            transport_limits: TransportConfig::default(),
            attr_ttl_ms: 1000,
            entry_ttl_ms: 1000,
            io_buffers: 64,
            io_buffer_bytes: 1 << 20,
            segment_bytes: 4 << 20,
            readahead_max_bytes: 32 << 20,
            readahead_mount_bytes: 256 << 20,
            write_buffer_file_bytes: 64 << 20,
            write_buffer_mount_bytes: 256 << 20,
            append_linger_ms: crate::file::APPEND_LINGER_MS,
            kernel_readahead_bytes: 8 << 20,
            writeback_cache: false,
            acl: true,
            fuse_threads: 4,
            allow_other: true,
            dev: false,
            suid: false,
            failover_timeout_ms: 30_000,
            meta_wait_ms: 30_000,
            early_replies: true,
            defer_removes: true,
            atime: AtimeMode::RelAtime,
            key_file: PathBuf::new(),
            client_name: String::new(),
            subdir: "/".into(),
            read_only: false,
            exec: true,
            fsname: "tessera".into(),
            metrics: telemetry::MetricsConfig::default(),
        }
    }
}

impl ClientConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.transport_limits.validate()?;
        self.metrics.validate()?;
        if transport::split_addrs(&self.meta_addr).is_empty() {
            return Err(
                "meta_addr must name the metadata server (or several, comma-separated)".into(),
            );
        }
        self.subdir_names()?;
        if self.fsname.is_empty() || self.fsname.contains([',', ' ', '\t', '\n']) {
            return Err("fsname must be non-empty, without commas or blanks".into());
        }
        if !(1..=4096).contains(&self.io_buffers) {
            return Err("io_buffers must be between 1 and 4096".into());
        }
        if !(64 * 1024..=16 << 20).contains(&self.io_buffer_bytes)
            || !self.io_buffer_bytes.is_power_of_two()
        {
            return Err("io_buffer_bytes must be a power of two from 64 KiB to 16 MiB".into());
        }
        if self.io_buffer_bytes > self.transport_limits.max_one_sided_bytes {
            return Err("io_buffer_bytes must not exceed transport max_one_sided_bytes".into());
        }
        self.validate_buffers()?;
        if !(1..=64).contains(&self.fuse_threads) {
            return Err("fuse_threads must be between 1 and 64".into());
        }
        if !(100..=600_000).contains(&self.failover_timeout_ms) {
            return Err("failover_timeout_ms must be between 100 and 600000".into());
        }
        if self.meta_wait_ms > 3_600_000 {
            return Err("meta_wait_ms must be at most 3600000 (one hour)".into());
        }
        Ok(())
    }

    /// Applies the mount options of `tessera mount -o` (comma-separated, as `mount -o`
    /// takes them): `noatime`, `relatime`, `strictatime`, `dev`, `nodev`, `suid`,
    /// `nosuid`, `ro`, `rw`, `exec`, `noexec`, and `defaults`, `async`, which are what
    /// the mount does anyway (`defaults` keeps `nodev,nosuid`). Any other option is
    /// refused by name rather than ignored.
    pub fn apply_mount_options(&mut self, options: &str) -> Result<(), String> {
        for o in options.split(',').filter(|o| !o.is_empty()) {
            match o {
                "noatime" => self.atime = AtimeMode::NoAtime,
                "relatime" => self.atime = AtimeMode::RelAtime,
                "strictatime" => self.atime = AtimeMode::StrictAtime,
                "dev" | "nodev" => self.dev = o == "dev",
                "suid" | "nosuid" => self.suid = o == "suid",
                "ro" | "rw" => self.read_only = o == "ro",
                "exec" | "noexec" => self.exec = o == "exec",
                "defaults" | "async" => {}
                _ => return Err(format!("mount option {o:?} is not supported")),
            }
        }
        Ok(())
    }

    /// The names leading from the namespace root to `subdir` (none: the root itself).
    pub fn subdir_names(&self) -> Result<Vec<&str>, String> {
        let Some(rest) = self.subdir.strip_prefix('/') else {
            return Err(format!("subdir {:?} must start with '/'", self.subdir));
        };
        let names: Vec<&str> = rest.split('/').filter(|n| !n.is_empty()).collect();
        if names.iter().any(|n| *n == "." || *n == "..") {
            return Err(format!("subdir {:?} must not hold . or ..", self.subdir));
        }
        Ok(names)
    }

    /// Checks the readahead and write-buffer sizes.
    fn validate_buffers(&self) -> Result<(), String> {
        const MAX_SEGMENT_BYTES: usize = 64 << 20;
        const MAX_KERNEL_READAHEAD_BYTES: u64 = 1 << 30;
        let seg = self.segment_bytes;
        if !seg.is_power_of_two() || !(self.io_buffer_bytes..=MAX_SEGMENT_BYTES).contains(&seg) {
            return Err(
                "segment_bytes must be a power of two from io_buffer_bytes to 64 MiB".into(),
            );
        }
        if seg > self.transport_limits.max_one_sided_bytes {
            return Err("segment_bytes must not exceed transport max_one_sided_bytes".into());
        }
        let seg = seg as u64;
        if self.readahead_max_bytes > 0 && self.readahead_mount_bytes < seg {
            return Err("readahead_mount_bytes must hold at least one segment".into());
        }
        if self.readahead_max_bytes > self.readahead_mount_bytes {
            return Err("readahead_max_bytes must not exceed readahead_mount_bytes".into());
        }
        if self.write_buffer_file_bytes > 0 && self.write_buffer_file_bytes < seg {
            return Err("write_buffer_file_bytes must be 0 or at least one segment".into());
        }
        if self.write_buffer_file_bytes > self.write_buffer_mount_bytes {
            return Err("write_buffer_file_bytes must not exceed write_buffer_mount_bytes".into());
        }
        if self.append_linger_ms > crate::file::MAX_APPEND_LINGER_MS {
            return Err("append_linger_ms must be at most 60000".into());
        }
        if self.kernel_readahead_bytes > MAX_KERNEL_READAHEAD_BYTES {
            return Err("kernel_readahead_bytes must be at most 1 GiB".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the example file drifting from the defaults it documents.
    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../tessera.example.toml");
        let parsed: ClientConfig = toml::from_str(text).expect("example parses");
        assert_eq!(parsed, ClientConfig::default());
        parsed.validate().expect("defaults are valid");
    }

    #[test]
    fn bad_values_are_refused_with_the_field_named() {
        let c = ClientConfig {
            io_buffer_bytes: 3 << 20,
            ..ClientConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("io_buffer_bytes"));
        assert!(toml::from_str::<ClientConfig>("attr_ttl = 5").is_err());
    }

    #[test]
    fn mount_options_set_the_atime_mode_and_unknown_ones_are_refused() {
        let mut c = ClientConfig::default();
        c.apply_mount_options("rw,noatime").unwrap();
        assert_eq!(c.atime, AtimeMode::NoAtime);
        c.apply_mount_options("strictatime").unwrap();
        assert_eq!(c.atime, AtimeMode::StrictAtime);
        c.apply_mount_options("relatime,").unwrap();
        assert_eq!(c.atime, AtimeMode::RelAtime);
        assert!(c.apply_mount_options("sync").unwrap_err().contains("sync"));
        assert!(!c.dev && !c.suid, "nodev,nosuid by default");
        c.apply_mount_options("dev,suid").unwrap();
        assert!(c.dev && c.suid);
        c.apply_mount_options("nodev,defaults").unwrap();
        assert!(!c.dev && c.suid);
        let parsed: ClientConfig = toml::from_str("atime = \"strictatime\"").unwrap();
        assert_eq!(parsed.atime, AtimeMode::StrictAtime);
        c.apply_mount_options("ro,noexec").unwrap();
        assert!(c.read_only && !c.exec);
        c.apply_mount_options("rw,exec").unwrap();
        assert!(!c.read_only && c.exec);
    }

    #[test]
    fn subdir_must_be_absolute_and_plain() {
        let mut c = ClientConfig::default();
        assert!(c.subdir_names().unwrap().is_empty());
        c.subdir = "/data//sets/".into();
        assert_eq!(c.subdir_names().unwrap(), ["data", "sets"]);
        c.subdir = "data".into();
        assert!(c.validate().unwrap_err().contains("start with '/'"));
        c.subdir = "/a/../b".into();
        assert!(c.validate().unwrap_err().contains(".."));
        c.subdir = "/".into();
        c.fsname = "a b".into();
        assert!(c.validate().unwrap_err().contains("fsname"));
    }
}

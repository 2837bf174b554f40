//! The network the harness cuts: one network namespace per nats-server node and per agent, joined by veth pairs
//! named by the run's id, so a partition is a firewall rule in one namespace and nothing else on the machine moves.
//!
//! Every address is in `10.<b>.0.0/16`, `b` drawn from the run's id (100..=199), so two runs rarely meet:
//! - Node `i` (1..=3) listens on `10.<b>.0.i`, an address on its namespace's loopback, reached over a point-to-point
//!   link from every namespace that may talk to it (`/32` routes, no default route: a cut link never falls back to
//!   something else that answers).
//! - The root namespace (workers, projector, gateway, sweeper, the producer and the checker) has a link to each node:
//!   `lc<id>r<i>` here, `lc<id><i>r` there, `10.<b>.<10+i>.0/30`.
//! - Nodes `i < j` are linked by `lc<id><i><j>` / `lc<id><j><i>`, `10.<b>.<100+10i+j>.0/30`.
//! - Agent number `n` (0, 1, ...; letter `k`, its own namespace) has a link to each node: `lc<id><k><i>` /
//!   `lc<id><i><k>`, `10.<b>.<200+10n+i>.0/30`.
//!
//! A partition drops packets (an nftables table `lhc` in the namespace: input and output chains), so connections
//! hang as on a real network instead of failing fast; healing flushes the chains. Links are never taken down: a
//! link that goes down loses its routes.
//!
//! Everything is made by `ip` and `nft` as root. A run writes its pid in `/run/leasehold-chaos/<id>`; a later run
//! removes the namespaces and links of runs whose process is gone.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Where runs leave their pid, so a later run knows which namespaces belong to runs that died.
const MARKERS: &str = "/run/leasehold-chaos";
/// The prefix of every namespace the harness makes: `lhc-<id>-n1`, `lhc-<id>-a`.
const PREFIX: &str = "lhc-";

/// The namespaces and links of one run.
#[derive(Debug)]
pub(crate) struct Net {
    id: String,
    /// The second octet of every address of the run.
    b: u8,
    nodes: u8,
    agents: Vec<char>,
    /// Namespaces made so far (removed at the end in reverse).
    made: Vec<String>,
    marker: PathBuf,
}

/// Runs `program args`, failing with its stderr.
fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Runs `nft -f -` in namespace `ns` with `script` on its stdin.
fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft")?;
    child.stdin.take().context("nft's stdin")?.write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft in {ns}: {}\n{script}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Whether this process may make namespaces (it runs as root).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

impl Net {
    /// The address node `i` (1-based) listens on.
    pub(crate) fn node_addr(&self, i: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.b, 0, i)
    }

    /// The `/30` numbered `n` of the run's range, and its two ends.
    fn pair(&self, n: usize) -> (String, String) {
        (format!("10.{}.{n}.1/30", self.b), format!("10.{}.{n}.2/30", self.b))
    }

    fn via(&self, n: usize, end: u8) -> String {
        format!("10.{}.{n}.{end}", self.b)
    }

    /// Where the run's processes are recorded (`PID STARTTIME` per start).
    pub(crate) fn pids_file(&self) -> PathBuf {
        Path::new(MARKERS).join(format!("{}.pids", self.id))
    }

    /// The run's id (four hex digits), in every name the run gives.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn node_ns(&self, i: u8) -> String {
        format!("{PREFIX}{}-n{i}", self.id)
    }

    pub(crate) fn agent_ns(&self, k: char) -> String {
        format!("{PREFIX}{}-{k}", self.id)
    }

    /// Makes the namespaces and links of run `id` (four hex digits) for `nodes` nodes and the agents `agents`
    /// (letters), after removing what dead runs left.
    pub(crate) fn create(id: &str, nodes: u8, agents: &[char]) -> anyhow::Result<Net> {
        remove_dead_runs();
        std::fs::create_dir_all(MARKERS).with_context(|| format!("cannot create {MARKERS}"))?;
        let marker = Path::new(MARKERS).join(id);
        std::fs::write(&marker, std::process::id().to_string())?;
        let b = 100 + (u16::from_str_radix(id, 16).unwrap_or(0) % 100) as u8;
        let mut net = Net { id: id.to_owned(), b, nodes, agents: agents.to_vec(), made: Vec::new(), marker };
        if let Err(e) = net.build() {
            net.destroy();
            return Err(e);
        }
        Ok(net)
    }

    fn build(&mut self) -> anyhow::Result<()> {
        let id = self.id.clone();
        for i in 1..=self.nodes {
            let ns = self.node_ns(i);
            self.namespace(&ns)?;
            let addr = format!("{}/32", self.node_addr(i));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "lo"])?;
            // The root's link to the node.
            let n = 10 + usize::from(i);
            let (here, there) = self.pair(n);
            self.link(None, &format!("lc{id}r{i}"), &here, &ns, &format!("lc{id}{i}r"), &there)?;
            run("ip", &["route", "add", &addr, "via", &self.via(n, 2)])?;
        }
        for i in 1..=self.nodes {
            for j in (i + 1)..=self.nodes {
                let (ns_i, ns_j) = (self.node_ns(i), self.node_ns(j));
                let n = 100 + 10 * usize::from(i) + usize::from(j);
                let (end_i, end_j) = self.pair(n);
                self.link(Some(&ns_i), &format!("lc{id}{i}{j}"), &end_i, &ns_j, &format!("lc{id}{j}{i}"), &end_j)?;
                let to_j = format!("{}/32", self.node_addr(j));
                run("ip", &["-n", &ns_i, "route", "add", &to_j, "via", &self.via(n, 2)])?;
                let to_i = format!("{}/32", self.node_addr(i));
                run("ip", &["-n", &ns_j, "route", "add", &to_i, "via", &self.via(n, 1)])?;
            }
        }
        for (number, k) in self.agents.clone().into_iter().enumerate() {
            let ns = self.agent_ns(k);
            self.namespace(&ns)?;
            for i in 1..=self.nodes {
                let n = 200 + 10 * number + usize::from(i);
                let (here, there) = self.pair(n);
                let node_ns = self.node_ns(i);
                self.link(Some(&ns), &format!("lc{id}{k}{i}"), &here, &node_ns, &format!("lc{id}{i}{k}"), &there)?;
                let to = format!("{}/32", self.node_addr(i));
                run("ip", &["-n", &ns, "route", "add", &to, "via", &self.via(n, 2)])?;
            }
        }
        let all: Vec<String> = self.made.clone();
        for ns in &all {
            nft(
                ns,
                "table inet lhc {\n  chain in { type filter hook input priority 0; policy accept; }\n  \
                 chain out { type filter hook output priority 0; policy accept; }\n}\n",
            )?;
        }
        Ok(())
    }

    fn namespace(&mut self, ns: &str) -> anyhow::Result<()> {
        run("ip", &["netns", "add", ns])?;
        self.made.push(ns.to_owned());
        run("ip", &["-n", ns, "link", "set", "lo", "up"])
    }

    /// A veth pair: `a` in `ns_a` (the root namespace when `None`) with `addr_a`, `b` in `ns_b` with `addr_b`.
    fn link(&self, ns_a: Option<&str>, a: &str, addr_a: &str, ns_b: &str, b: &str, addr_b: &str) -> anyhow::Result<()> {
        run("ip", &["link", "add", a, "type", "veth", "peer", "name", b])?;
        run("ip", &["link", "set", b, "netns", ns_b])?;
        if let Some(ns_a) = ns_a {
            run("ip", &["link", "set", a, "netns", ns_a])?;
        }
        let in_a = |args: &[&str]| match ns_a {
            Some(ns) => run("ip", &[&["-n", ns], args].concat()),
            None => run("ip", args),
        };
        in_a(&["addr", "add", addr_a, "dev", a])?;
        in_a(&["link", "set", a, "up"])?;
        run("ip", &["-n", ns_b, "addr", "add", addr_b, "dev", b])?;
        run("ip", &["-n", ns_b, "link", "set", b, "up"])
    }

    /// Drops every packet between node `i` and the other nodes (clients still reach it: a minority partition).
    pub(crate) fn isolate_node_from_peers(&self, i: u8) -> anyhow::Result<()> {
        let mut script = String::new();
        for j in (1..=self.nodes).filter(|j| *j != i) {
            let dev = format!("lc{}{i}{j}", self.id);
            let _ = writeln!(script, "add rule inet lhc in iifname \"{dev}\" drop");
            let _ = writeln!(script, "add rule inet lhc out oifname \"{dev}\" drop");
        }
        nft(&self.node_ns(i), &script)
    }

    /// Drops every packet of node `i` but its own loopback's: nobody reaches it, it reaches nobody.
    pub(crate) fn isolate_node(&self, i: u8) -> anyhow::Result<()> {
        nft(
            &self.node_ns(i),
            "add rule inet lhc in iifname != \"lo\" drop\nadd rule inet lhc out oifname != \"lo\" drop\n",
        )
    }

    /// Drops every packet between agent `k` and the servers.
    pub(crate) fn cut_agent(&self, k: char) -> anyhow::Result<()> {
        nft(
            &self.agent_ns(k),
            "add rule inet lhc in iifname != \"lo\" drop\nadd rule inet lhc out oifname != \"lo\" drop\n",
        )
    }

    /// Ends every partition.
    pub(crate) fn heal(&self) -> anyhow::Result<()> {
        self.made.iter().try_for_each(|ns| self.heal_ns(ns))
    }

    /// Ends the partitions made in namespace `ns`.
    pub(crate) fn heal_ns(&self, ns: &str) -> anyhow::Result<()> {
        nft(ns, "flush chain inet lhc in\nflush chain inet lhc out\n")
    }

    /// Removes the links and namespaces (the processes in them must be gone first).
    pub(crate) fn destroy(&mut self) {
        for i in 1..=self.nodes {
            let _ = run("ip", &["link", "del", &format!("lc{}r{i}", self.id)]);
        }
        for ns in self.made.drain(..).rev() {
            let _ = run("ip", &["netns", "del", &ns]);
        }
        let _ = std::fs::remove_file(&self.marker);
        let _ = std::fs::remove_file(self.pids_file());
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// Removes the namespaces (and root-side links) of runs whose harness process is gone.
fn remove_dead_runs() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for ns in listing.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(id) = ns.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if run_alive(id) {
            continue;
        }
        let marker = Path::new(MARKERS).join(id);
        kill_recorded(&Path::new(MARKERS).join(format!("{id}.pids")));
        // What still runs in it (its harness died without stopping it: kill -9) goes first.
        if let Ok(pids) = Command::new("ip").args(["netns", "pids", ns]).output() {
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        for i in 1..=9 {
            let _ = Command::new("ip").args(["link", "del", &format!("lc{id}r{i}")]).stderr(Stdio::null()).status();
        }
        let _ = run("ip", &["netns", "del", ns]);
        let _ = std::fs::remove_file(marker);
    }
}

/// Whether the run `id`'s harness process still runs.
pub(crate) fn run_alive(id: &str) -> bool {
    std::fs::read_to_string(Path::new(MARKERS).join(id))
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// Kills every process a dead run recorded that still runs (the same pid and start time), then forgets them.
fn kill_recorded(registry: &Path) {
    let Ok(text) = std::fs::read_to_string(registry) else { return };
    for line in text.lines() {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(pid)), Some(Ok(start))) = (fields.next(), fields.next()) else { continue };
        let Ok(pid) = u32::try_from(pid) else { continue };
        if crate::procs::start_time(pid) == Some(start) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
    let _ = std::fs::remove_file(registry);
}

//! `cuda-endpoints-fabric`: runs a command (a job: `mpirun -n 8 ./app`, or
//! one program) on a model fabric that its processes share.
//!
//! ```text
//! cuda-endpoints-fabric [-n N [--tag-output]] [--nodes N] [--gpus G] [--no-imex] [--queries Q] [--driver-version V] [--timeout SECS] -- COMMAND [ARGS...]
//! ```
//!
//! With `-n N` it starts N processes of COMMAND itself (no MPI), each with
//! `CUDA_ENDPOINTS_RANK`, `CUDA_ENDPOINTS_SIZE`, `CUDA_ENDPOINTS_NODE` and a
//! fresh TCP bootstrap unique id (`CUDA_ENDPOINTS_BOOTSTRAP_ID`, a loopback
//! port the launcher bound for rank 0 and hands down to it as an inherited
//! listening socket, `CUDA_ENDPOINTS_BOOTSTRAP_LISTEN_FD`, so that no other
//! process can take the port first): `Tcp::from_env(timeout)` gives each its
//! bootstrap. The job runs in a process group of its own; its processes
//! get `SIGKILL` when the launcher dies (`PR_SET_PDEATHSIG`), and a
//! watchdog (a shell waiting on a pipe from the launcher) ends the group
//! and removes the fabric's temporary directory when the launcher dies by
//! any signal, SIGKILL included. `--tag-output` (with `-n`, as `mpirun
//! --tag-output`) starts each line a rank prints with `[rank R] `, on the
//! stream it printed it to, so that the ranks' lines can be told apart: a
//! line is forwarded when it ends (a prompt without a newline waits for
//! one), a line longer than 64 KiB in pieces of 64 KiB, and what a process
//! the job left behind prints more than 2 s after the job ended is lost.
//!
//! (`cuda-endpoints-fabric --help` says what each flag does and the exit
//! statuses; the arguments are parsed by `clap`.)
//!
//! Starts a fabric server of `N` nodes with `G` GPUs each (default 1 × 4) on
//! a socket in a fresh temporary directory, exports `CUDA_ENDPOINTS_FABRIC`
//! to the command (its processes join with `cuda_endpoints::fabric::connect_env()`, placed
//! on nodes by rank), waits for it, waits for every process to leave, and
//! reports what each one left behind. Exits with the command's status if
//! it failed, 1 if it could not be waited for or ran past `--timeout`, 2 on
//! bad arguments or a fabric or command that could not start, 3 if any
//! process leaked or any rule was violated, else 0.
//!
//! `--driver-version V` makes every node a driver of that version (e.g.
//! `13000`: driver 580, no logical endpoints, as `ModelConfig::cuda_13_0`).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{FABRIC_ENV, FabricServer};
use crate::driver::LOGICAL_ENDPOINT_MIN_VERSION;
use crate::{FabricConfig, ModelConfig};

/// Runs COMMAND (a job: `mpirun -n 8 ./app`, or one program) on a model
/// fabric that its processes share, and reports what each process left
/// behind.
#[derive(Debug, clap::Parser)]
#[command(
    name = "cuda-endpoints-fabric",
    version,
    after_help = "The command's processes find the fabric in CUDA_ENDPOINTS_FABRIC \
(cuda_endpoints::fabric::connect_env()) and are placed on nodes by rank.

Exit status:
  0    the command succeeded and nothing leaked
  1    the command could not be waited for or ran past --timeout (killed)
  2    bad arguments, or the fabric or the command could not be started
  3    the command succeeded, but a process leaked, a rule was violated or
       a process was still connected
  N    the command failed with status N (1 if it had none)"
)]
struct Args {
    /// Nodes of the fabric (1 to 1024).
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    nodes: u16,
    /// GPUs on each node (1 to 1024).
    #[arg(long, default_value_t = 4, value_name = "G",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    gpus: u16,
    /// The nodes have no IMEX channel: fabric handles cannot be shared.
    #[arg(long)]
    no_imex: bool,
    /// Queries before an endpoint reports ready (the model's default if not given).
    #[arg(long, value_name = "Q")]
    queries: Option<u32>,
    /// Every node's driver version, e.g. 13000 (driver 580, no logical
    /// endpoints, as `ModelConfig::cuda_13_0`) or 13050 (the fabric copy).
    /// Default: the model's, 13040 (logical endpoints; copies take the
    /// portable path, through windows onto peers' memory).
    #[arg(long, value_name = "V", value_parser = clap::value_parser!(i32).range(0..))]
    driver_version: Option<i32>,
    /// Kill the command after this many seconds and exit 1.
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Start the job's N ranks here, without MPI: N processes of COMMAND,
    /// each with CUDA_ENDPOINTS_RANK (0..N), CUDA_ENDPOINTS_SIZE (N),
    /// CUDA_ENDPOINTS_NODE (rank * nodes / N) and a fresh TCP bootstrap
    /// unique id in CUDA_ENDPOINTS_BOOTSTRAP_ID (rank 0 listens on the
    /// loopback port it names): each rank's
    /// `cuda_endpoints::bootstrap::Tcp::from_env(timeout)` gives its bootstrap.
    #[arg(short = 'n', long = "ranks", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    ranks: Option<u32>,
    /// With -n: start each line a rank prints (stdout and stderr) with
    /// `[rank R] `, as `mpirun --tag-output` does.
    #[arg(long, requires = "ranks")]
    tag_output: bool,
    /// The command to run, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The launcher's `main`: reads the process's arguments, runs the job,
/// and answers the exit status described in the module docs.
pub fn main() -> ExitCode {
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(a) => a,
        Err(e) => {
            // `--help` and `--version` print to stdout and exit 0; a bad
            // argument prints why and the usage, and exits 2.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let (nodes, gpus) = (usize::from(args.nodes), usize::from(args.gpus));
    let timeout = args.timeout.map(Duration::from_secs);
    let mut config = FabricConfig::nodes(nodes, gpus).imex_channel(!args.no_imex);
    if let Some(v) = args.driver_version {
        config = config.with_nodes(|_, n| {
            if v < LOGICAL_ENDPOINT_MIN_VERSION {
                *n = ModelConfig::cuda_13_0(n.devices.len());
            }
            n.driver_version = v;
        });
    }
    if let Some(q) = args.queries {
        config = config.with_nodes(|_, n| n.queries_to_ready = q);
    }
    let server = match FabricServer::start(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cuda-endpoints-fabric: {e}");
            return ExitCode::from(2);
        }
    };
    // The watchdog before anything else can be seen of the fabric: a
    // launcher killed from here on still has its directory removed.
    let watch = watchdog(server.socket());
    eprintln!(
        "cuda-endpoints-fabric: {} node(s) x {} GPU(s) at {}",
        nodes,
        gpus,
        server.socket().display()
    );
    // Ranks are placed `rank * nodes / N` to a node and round-robin on its
    // GPUs: more ranks than GPUs share devices, which unicast peers allow
    // but a multicast team refuses (each rank of a node brings its own).
    if let Some(n) = args.ranks.map(|n| n as usize)
        && n > nodes.saturating_mul(gpus)
    {
        eprintln!(
            "cuda-endpoints-fabric: warning: {n} ranks on {nodes} node(s) x {gpus} GPU(s): some ranks share a device, which a multicast team refuses; give --gpus {}",
            n.div_ceil(nodes.max(1))
        );
    }
    let mut job = match spawn_job(&args, &server, nodes, watch) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("cuda-endpoints-fabric: cannot run {}: {e}", args.command[0]);
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    let status = loop {
        match job.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(e) => {
                eprintln!("cuda-endpoints-fabric: waiting for the command: {e}");
                job.kill();
                break None;
            }
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            eprintln!("cuda-endpoints-fabric: the command ran past --timeout; killed");
            job.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The ranks' last lines, before the launcher's own report.
    job.drain_output(Duration::from_secs(2));
    // Processes of the job may outlive the command by a moment (their
    // connections close as they exit).
    let idle = server.wait_idle(Duration::from_secs(10));
    let exits = server.exits();
    let leaks = server.leaks();
    let live = server.live();
    let violations = server.violations();
    eprintln!(
        "cuda-endpoints-fabric: {} process(es) joined, {} left; fabric holds {:?}",
        server.joined(),
        exits.len(),
        live
    );
    for l in &leaks {
        eprintln!(
            "cuda-endpoints-fabric: process {} (OS pid {}, node {}) left holding {:?}",
            l.pid, l.os_pid, l.node, l.held
        );
    }
    for v in &violations {
        eprintln!(
            "cuda-endpoints-fabric: rule {} broken by {} ({})",
            v.rule, v.call, v.code
        );
    }
    if !idle {
        eprintln!(
            "cuda-endpoints-fabric: {} process(es) still connected",
            server.running()
        );
    }
    drop(server);
    job.disarm();
    match status {
        Some(s) if !s.success() => {
            eprintln!("cuda-endpoints-fabric: the command failed: {s}");
            ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1))
        }
        None => ExitCode::from(1),
        Some(_) if !leaks.is_empty() || !violations.is_empty() || !live.is_empty() || !idle => {
            ExitCode::from(3)
        }
        Some(_) => {
            eprintln!("cuda-endpoints-fabric: nothing leaked");
            ExitCode::SUCCESS
        }
    }
}

/// The job: its processes, all in one process group of their own, and the
/// watchdog that ends that group and removes the fabric's directory if the
/// launcher dies first (any signal, SIGKILL included).
struct Job {
    children: Vec<Child>,
    pgid: i32,
    watchdog: Option<Child>,
    /// With `--tag-output`: one thread per rank's stream forwarding its
    /// lines, and the channel each says it is done on.
    tagging: Vec<std::thread::JoinHandle<()>>,
    tagged: Option<std::sync::mpsc::Receiver<()>>,
}

fn spawn_job(
    args: &Args,
    server: &FabricServer,
    nodes: usize,
    watch: Option<Child>,
) -> std::io::Result<Job> {
    let ranks = args.ranks.map(|n| n as usize);
    // Rank 0's listener, bound here and handed down to rank 0 alone
    // (`LISTEN_FD_ENV`): the port stays taken from the moment it is chosen,
    // so no other process can bind it before rank 0 starts. It is
    // close-on-exec here; only rank 0's child clears that flag.
    let (listener, id) = match ranks {
        Some(_) => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let id = cuda_endpoints_bootstrap::UniqueId::generate(l.local_addr()?)?;
            (Some(l), Some(id))
        }
        None => (None, None),
    };
    let mut job = Job {
        children: Vec::new(),
        pgid: 0,
        watchdog: watch,
        tagging: Vec::new(),
        tagged: None,
    };
    let (done, tagged) = std::sync::mpsc::channel();
    if args.tag_output {
        job.tagged = Some(tagged);
    }
    for rank in 0..ranks.unwrap_or(1) {
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..])
            .env(FABRIC_ENV, server.env_value())
            .process_group(job.pgid);
        if args.tag_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        if let (Some(n), Some(id)) = (ranks, &id) {
            let node = rank.checked_mul(nodes).map_or(0, |x| x / n.max(1));
            cmd.env(cuda_endpoints_bootstrap::RANK_ENV, rank.to_string())
                .env(cuda_endpoints_bootstrap::SIZE_ENV, n.to_string())
                .env(cuda_endpoints_bootstrap::NODE_ENV, node.to_string())
                .env(cuda_endpoints_bootstrap::UNIQUE_ID_ENV, id.to_string());
        }
        let inherit = match (&listener, rank) {
            (Some(l), 0) => {
                let raw = std::os::fd::AsRawFd::as_raw_fd(l);
                cmd.env(cuda_endpoints_bootstrap::LISTEN_FD_ENV, raw.to_string());
                Some(raw)
            }
            _ => None,
        };
        // SAFETY: the closure runs in the child between fork and exec and
        // only calls `prctl(PR_SET_PDEATHSIG)` and, for rank 0,
        // `fcntl(F_SETFD)` on the listener's descriptor, which the forked
        // child holds open (the parent keeps `listener` alive until every
        // child is spawned); both are async-signal-safe and touch no memory
        // of the parent.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(std::io::Error::from)?;
                if let Some(raw) = inherit {
                    let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut c) => {
                if job.pgid == 0 {
                    job.pgid = i32::try_from(c.id()).unwrap_or(0);
                }
                let (out, err) = (c.stdout.take(), c.stderr.take());
                job.children.push(c);
                let tag = format!("[rank {rank}] ");
                let forwarders = [
                    out.map(|o| tag_lines(o, std::io::stdout(), tag.clone(), done.clone())),
                    err.map(|e| tag_lines(e, std::io::stderr(), tag, done.clone())),
                ];
                for f in forwarders.into_iter().flatten() {
                    match f {
                        Ok(t) => job.tagging.push(t),
                        Err(e) => {
                            job.kill();
                            return Err(e);
                        }
                    }
                }
            }
            Err(e) => {
                job.kill();
                return Err(e);
            }
        }
    }
    // Rank 0 holds the listener now; the launcher's copy goes.
    drop(listener);
    // The watchdog learns the job's process group now that it exists.
    if let Some(stdin) = job.watchdog.as_mut().and_then(|w| w.stdin.as_mut()) {
        let _ = writeln!(stdin, "{}", job.pgid);
    }
    Ok(job)
}

/// The most bytes of one line a tagged stream holds before it forwards
/// them as a line of their own (a rank that prints a long line without a
/// newline costs the launcher no more memory than this).
const TAG_LINE_MAX: usize = 64 << 10;

/// A thread forwarding `from` (a rank's stdout or stderr) to `to`, each line
/// (or each [`TAG_LINE_MAX`] bytes of one) started with `tag` and written
/// whole under `to`'s lock, so that the ranks' lines do not interleave;
/// says so on `done` when `from` ends (every process holding it closed it).
fn tag_lines<R, W>(
    from: R,
    to: W,
    tag: String,
    done: std::sync::mpsc::Sender<()>,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    R: std::io::Read + Send + 'static,
    W: std::io::Write + Send + 'static,
{
    use std::io::BufRead;
    std::thread::Builder::new()
        .name("tag-output".into())
        // Two a rank, up to 4,096 ranks: small stacks (the thread holds
        // its line on the heap).
        .stack_size(64 << 10)
        .spawn(move || {
            let mut from = std::io::BufReader::new(from);
            let mut to = to;
            let mut line = Vec::with_capacity(256);
            loop {
                line.clear();
                let read = std::io::Read::take(&mut from, TAG_LINE_MAX as u64)
                    .read_until(b'\n', &mut line);
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut whole = Vec::with_capacity(tag.len() + line.len());
                whole.extend_from_slice(tag.as_bytes());
                whole.extend_from_slice(&line);
                // The launcher's own stream gone (a closed pipe): keep
                // reading, so that the rank never blocks on a full pipe.
                let _ = to.write_all(&whole).and_then(|()| to.flush());
            }
            let _ = done.send(());
        })
}

/// A shell in its own process group that reads the job's process group,
/// then waits for the launcher to close its stdin: "done" when the launcher
/// ends normally; anything else (the launcher died, even before it said the
/// group, whose processes then die with it: `PR_SET_PDEATHSIG`) makes it end
/// the job's process group and remove the fabric's directory.
fn watchdog(socket: &std::path::Path) -> Option<Child> {
    let dir = socket.parent()?;
    Command::new("/bin/sh")
        .args([
            "-c",
            r#"read pg; [ "$pg" = done ] && exit 0; read x; [ "$x" = done ] && exit 0; case "$pg" in ''|*[!0-9]*|0) ;; *) kill -TERM -- "-$pg" 2>/dev/null; sleep 1; kill -KILL -- "-$pg" 2>/dev/null ;; esac; rm -rf -- "$1""#,
            "cuda-endpoints-fabric-watchdog",
        ])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}

impl Job {
    /// With `--tag-output`, waits (at most `bound`) for every rank's
    /// streams to end, so that their last lines come before the launcher's
    /// report; a stream a process the job left behind still holds is left
    /// to its thread.
    fn drain_output(&mut self, bound: Duration) {
        let Some(tagged) = self.tagged.take() else {
            return;
        };
        let deadline = Instant::now() + bound;
        let mut ended = 0;
        while ended < self.tagging.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if tagged.recv_timeout(left).is_err() {
                return;
            }
            ended += 1;
        }
        for t in self.tagging.drain(..) {
            let _ = t.join();
        }
    }

    /// Every process's status once all have exited: the first failure, or
    /// success.
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let mut all = Vec::with_capacity(self.children.len());
        for c in &mut self.children {
            match c.try_wait()? {
                Some(s) => all.push(s),
                None => return Ok(None),
            }
        }
        Ok(all.iter().find(|s| !s.success()).or(all.first()).copied())
    }

    /// Ends the whole process group (the command's own children too).
    fn kill(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pgid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The launcher ends normally: the watchdog leaves without acting.
    fn disarm(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            if let Some(mut stdin) = w.stdin.take() {
                let _ = stdin.write_all(b"done\n");
            }
            let _ = w.wait();
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.disarm();
    }
}

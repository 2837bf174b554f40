//! The dir driver: one directory per resource, named by the resource id, under a root directory. For one machine,
//! tests and demos: a directory is cheap to make, easy to delete by hand, and shows every case a real driver has.

use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_schemas::ResourceId;
use leasehold_schemas::ids::AgentName;

use crate::driver::{Driver, DriverError, Health, Listed, Spec};

/// The name of the file a health check writes and removes inside a resource's directory.
const PROBE: &str = ".leasehold-probe";
/// A resource directory holding this file has failed for good (what uses it wrote why in it): the listing says so,
/// and a health check finds it unhealthy. The directory's counterpart of a container that exited.
pub const FAILED_FILE: &str = ".leasehold-failed";
/// The file in the root that says which agent the root is for, locked while an agent process uses it.
pub const OWNER_FILE: &str = ".leasehold-agent";

/// Resources as directories under `root` (made when first needed). Only directories whose names are canonical
/// resource ids are handles; other files and directories are left alone. One root is one agent's: [`Driver::open`]
/// holds an exclusive lock on the root directory itself and writes the agent's name in `.leasehold-agent`, so two
/// agents (or two processes of one) never share a root, where each would destroy the other's directories as
/// unknown. Once opened, a listing is refused (nothing reported, nothing destroyed) while the root is gone or its
/// `.leasehold-agent` does not name this agent: a root replaced or taken over behind the agent's back is not its.
#[derive(Debug, Clone)]
pub struct DirDriver {
    root: PathBuf,
    /// The locked root, once opened.
    owner: Arc<Mutex<Option<Owner>>>,
    /// Calls into the file system whose caller gave up (its timeout) while they still run: a hung mount.
    stuck: Arc<AtomicUsize>,
}

/// Past this many calls that outlived their caller and still run, the driver starts no new one (each holds a thread
/// of the blocking pool for as long as the file system hangs): it says so, and the agent records its driver
/// unavailable, until they return.
const MAX_STUCK_CALLS: usize = 2;

/// One blocking call's fate, shared by its caller and the thread running it.
#[derive(Debug, Default)]
struct CallState {
    done: bool,
    abandoned: bool,
}

/// Held by the caller while it waits: dropped before the call is done (the caller's timeout), the call counts as
/// stuck until its thread returns.
struct Waiting {
    state: Arc<Mutex<CallState>>,
    stuck: Arc<AtomicUsize>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !state.done {
            state.abandoned = true;
            self.stuck.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The root as opened: the locked directory, its identity (device and inode) and the agent it is for.
#[derive(Debug)]
struct Owner {
    _locked: std::fs::File,
    identity: (u64, u64),
    agent: AgentName,
}

impl DirDriver {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirDriver { root: root.into(), owner: Arc::default(), stuck: Arc::default() }
    }

    /// Runs `work` on the blocking pool, refusing to start while too many earlier calls hang (see
    /// [`MAX_STUCK_CALLS`]). A caller that gives up leaves the call counted as stuck until it returns.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&DirDriver) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let stuck = self.stuck.load(Ordering::SeqCst);
        if stuck >= MAX_STUCK_CALLS {
            return Err(DriverError::Transient(format!(
                "{stuck} calls into {} have not returned (a hung file system?): nothing new is started there until \
                 they do",
                self.root.display()
            )));
        }
        let state = Arc::new(Mutex::new(CallState::default()));
        let waiting = Waiting { state: state.clone(), stuck: self.stuck.clone() };
        let (driver, stuck) = (self.clone(), self.stuck.clone());
        let result = tokio::task::spawn_blocking(move || {
            let result = work(&driver);
            let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            state.done = true;
            if state.abandoned {
                stuck.fetch_sub(1, Ordering::SeqCst);
            }
            result
        })
        .await;
        drop(waiting);
        result.map_err(|e| DriverError::Transient(format!("a call into {} failed: {e}", self.root.display())))?
    }

    fn open_blocking(&self, agent: &AgentName) -> Result<(), DriverError> {
        let root = &self.root;
        let refuse = |why: String| Err(DriverError::Transient(why));
        // Not this agent's to take, whatever the disk does: the process must not run on it.
        let taken = |why: String| Err(DriverError::Refused(why));
        if let Err(e) = std::fs::create_dir_all(root) {
            return refuse(format!("cannot make the root {}: {e}", root.display()));
        }
        if !root.is_dir() {
            return refuse(format!("the root {} is not a directory", root.display()));
        }
        // A root inside another agent's root, or named like a resource id, would be taken for a handle (and
        // destroyed) by the agent of the root around it.
        if root.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.parse::<ResourceId>().is_ok()) {
            return taken(format!("the root {} is named like a resource id: name it otherwise", root.display()));
        }
        if let Ok(absolute) = std::fs::canonicalize(root) {
            for outer in absolute.ancestors().skip(1) {
                if outer.join(OWNER_FILE).exists() {
                    return taken(format!(
                        "the root {} is inside {}, the root of another agent (see its {OWNER_FILE}): roots do not nest",
                        root.display(),
                        outer.display()
                    ));
                }
            }
        }
        let path = root.join(OWNER_FILE);
        // The lock is on the directory itself: deleting or replacing the owner file does not free it.
        let locked = match std::fs::File::open(root) {
            Ok(locked) => locked,
            Err(e) => return refuse(format!("cannot open the root {}: {e}", root.display())),
        };
        match locked.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return taken(format!(
                    "{} is in use by another agent process (named in {}): one root per agent",
                    root.display(),
                    path.display()
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return refuse(format!("cannot lock {}: {e}", root.display())),
        }
        let mut file = match std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)
        {
            Ok(file) => file,
            Err(e) => return refuse(format!("cannot open {}: {e}", path.display())),
        };
        let mut named = String::new();
        if let Err(e) = file.read_to_string(&mut named) {
            return refuse(format!("cannot read {}: {e}", path.display()));
        }
        let named = named.trim();
        if !named.is_empty() && named != agent.as_str() {
            return taken(format!(
                "{} holds the resources of agent {named} (see {}), not of {agent}: one root per agent (to give a \
                 machine's root to another agent name, retire the old agent, let it release what it holds, then \
                 remove {OWNER_FILE})",
                root.display(),
                path.display()
            ));
        }
        if named.is_empty() {
            let written = file.set_len(0).and_then(|()| file.write_all(format!("{agent}\n").as_bytes()));
            if let Err(e) = written.and_then(|()| file.sync_all()) {
                return refuse(format!("cannot write {}: {e}", path.display()));
            }
        }
        let identity = match locked.metadata() {
            Ok(meta) => (meta.dev(), meta.ino()),
            Err(e) => return refuse(format!("cannot read {}: {e}", root.display())),
        };
        *self.owner.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Owner { _locked: locked, identity, agent: agent.clone() });
        Ok(())
    }

    /// Once opened: the root must still be there and still name this agent.
    fn check_owner(&self) -> Result<(), DriverError> {
        let (identity, agent) = match &*self.owner.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(owner) => (owner.identity, owner.agent.clone()),
            None => return Ok(()),
        };
        let path = self.root.join(OWNER_FILE);
        let refuse = |why: String| {
            Err(DriverError::Transient(format!(
                "{why}: nothing is made, listed, reported or destroyed there until it is back"
            )))
        };
        // The very directory locked at open, not another one at the same path (a copy, a bare mount point).
        match std::fs::metadata(&self.root) {
            Ok(meta) if (meta.dev(), meta.ino()) == identity => {}
            Ok(_) => {
                return refuse(format!("the root {} is another directory than the one opened", self.root.display()));
            }
            Err(e) => return refuse(format!("the root {} is not agent {agent}'s any more ({e})", self.root.display())),
        }
        match std::fs::read_to_string(&path) {
            Ok(named) if named.trim() == agent.as_str() => Ok(()),
            Ok(named) => refuse(format!("{} names agent {:?}, not {agent}", path.display(), named.trim())),
            Err(e) => refuse(format!(
                "the root {} is not agent {agent}'s any more ({}: {e})",
                self.root.display(),
                path.display()
            )),
        }
    }

    fn create_blocking(&self, id: ResourceId) -> Result<Option<String>, DriverError> {
        self.check_owner()?;
        let path = self.path_of(id);
        // Never the root itself: a root that is gone is not made again here (the check above refused it).
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.owner.lock().map_or(true, |o| o.is_none()) => {
                // A driver used without `open` (tests): the root is made when first needed.
                std::fs::create_dir_all(&path).map_err(|e| create_error(&path, e))?;
            }
            Err(e) => return Err(create_error(&path, e)),
        }
        // `create_dir_all` accepts a path that exists as anything; only a directory is the resource.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => Ok(Some(path.display().to_string())),
            Ok(_) => Err(create_error(&path, io::Error::from(io::ErrorKind::AlreadyExists))),
            Err(e) => Err(DriverError::Transient(format!("cannot read {}: {e}", path.display()))),
        }
    }

    fn destroy_blocking(&self, id: ResourceId) -> Result<(), DriverError> {
        self.check_owner()?;
        let path = self.path_of(id);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DriverError::Transient(format!("cannot remove {}: {e}", path.display()))),
        }
    }

    fn list_blocking(&self) -> Result<Vec<Listed>, DriverError> {
        self.check_owner()?;
        let failed = |e: io::Error| DriverError::Transient(format!("cannot list {}: {e}", self.root.display()));
        std::fs::create_dir_all(&self.root).map_err(failed)?;
        let mut handles = Vec::new();
        for entry in std::fs::read_dir(&self.root).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let Some(id) = entry.file_name().to_str().and_then(|name| name.parse::<ResourceId>().ok()) else {
                continue;
            };
            // A plain file named like a resource id is not a handle either (and stays where it is).
            if entry.file_type().map_err(failed)?.is_dir() {
                handles.push(Listed { id, failed: self.failure_of(id) });
            }
        }
        handles.sort_by_key(|listed| listed.id);
        Ok(handles)
    }

    fn check_blocking(&self, id: ResourceId) -> Result<Health, DriverError> {
        self.check_owner()?;
        // A root that cannot be read says nothing of the resource: answering "unhealthy" would have the writer
        // release a resource that may be fine on a disk the agent cannot reach for now.
        match std::fs::metadata(&self.root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(DriverError::Transient(format!("the root {} is not a directory", self.root.display())));
            }
            Err(e) => return Err(DriverError::Transient(format!("cannot read the root {}: {e}", self.root.display()))),
        }
        let path = self.path_of(id);
        let unhealthy = |detail: String| Ok(Health { healthy: false, detail });
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return unhealthy(format!("{} is not a directory", path.display())),
            Err(e) => return unhealthy(format!("{}: {e}", path.display())),
        }
        if let Some(why) = self.failure_of(id) {
            return unhealthy(why);
        }
        let probe = path.join(PROBE);
        if let Err(e) = std::fs::write(&probe, b"probe") {
            return unhealthy(format!("{} is not writable: {e}", path.display()));
        }
        if let Err(e) = std::fs::remove_file(&probe) {
            return unhealthy(format!("cannot remove {}: {e}", probe.display()));
        }
        Ok(Health { healthy: true, detail: format!("{} exists and is writable", path.display()) })
    }

    /// What the resource's `.leasehold-failed` says, if it has one.
    fn failure_of(&self, id: ResourceId) -> Option<String> {
        let path = self.path_of(id).join(FAILED_FILE);
        let said = std::fs::read(&path).ok()?;
        let said = String::from_utf8_lossy(&said[..said.len().min(512)]).trim().to_owned();
        Some(if said.is_empty() { format!("{} exists", path.display()) } else { format!("failed: {said}") })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the resource `id` lives.
    pub fn path_of(&self, id: ResourceId) -> PathBuf {
        self.root.join(id.to_string())
    }
}

/// The one error no retry will mend: the resource's name is taken by a file. Anything else (the root unwritable,
/// read-only or gone) is the machine's trouble, not the resource's: tried again later.
fn create_error(path: &Path, e: io::Error) -> DriverError {
    let detail = format!("cannot make directory {}: {e}", path.display());
    match e.kind() {
        io::ErrorKind::AlreadyExists => DriverError::CreateFailed(detail),
        _ => DriverError::Transient(detail),
    }
}

impl Driver for DirDriver {
    async fn open(&self, agent: &AgentName) -> Result<(), DriverError> {
        let agent = agent.clone();
        self.blocking(move |driver| driver.open_blocking(&agent)).await
    }

    async fn create(&self, id: ResourceId, _spec: &Spec) -> Result<Option<String>, DriverError> {
        self.blocking(move |driver| driver.create_blocking(id)).await
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        self.blocking(move |driver| driver.destroy_blocking(id)).await
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        self.blocking(|driver| driver.list_blocking()).await
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        self.blocking(move |driver| driver.check_blocking(id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(n: u8) -> ResourceId {
        ResourceId::from_parts(1_800_000_000_000, [n; 10])
    }

    #[tokio::test]
    async fn listing_shows_only_directories_named_by_resource_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = DirDriver::new(tmp.path().join("root"));
        assert_eq!(driver.list().await.unwrap(), vec![], "a missing root is made and empty");
        driver.create(id(2), &Spec::default()).await.unwrap();
        driver.create(id(1), &Spec::default()).await.unwrap();
        std::fs::create_dir(driver.root().join("scratch")).unwrap();
        std::fs::write(driver.root().join("notes.txt"), "hello").unwrap();
        std::fs::write(driver.root().join(id(3).to_string()), "a file, not a handle").unwrap();
        std::fs::create_dir(driver.root().join(id(4).to_string().to_uppercase())).unwrap();
        assert_eq!(driver.list().await.unwrap(), vec![Listed::present(id(1)), Listed::present(id(2))]);
    }

    #[tokio::test]
    async fn a_root_is_one_agents_and_one_process_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let (w1, w2) = (AgentName::new("w1").unwrap(), AgentName::new("w2").unwrap());
        let first = DirDriver::new(&root);
        first.open(&w1).await.unwrap();
        assert_eq!(std::fs::read_to_string(root.join(OWNER_FILE)).unwrap(), "w1\n");
        let err = DirDriver::new(&root).open(&w1).await.unwrap_err().to_string();
        assert!(err.contains("in use by another agent process"), "{err}");
        let err = DirDriver::new(&root).open(&w2).await.unwrap_err().to_string();
        assert!(err.contains("in use by another agent process"), "{err}");
        drop(first);
        // The lock goes with the last descriptor of the root: a process another test forks at that moment holds a
        // copy until it execs (close-on-exec), so the lock may outlive `first` by that long, never longer.
        let opened_once_free = |agent: AgentName| {
            let root = root.clone();
            async move {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    let driver = DirDriver::new(&root);
                    match driver.open(&agent).await {
                        Err(e)
                            if e.to_string().contains("in use by another") && std::time::Instant::now() < deadline =>
                        {
                            tokio::task::yield_now().await;
                        }
                        result => return result.map(|()| driver),
                    }
                }
            }
        };
        let Err(err) = opened_once_free(w2.clone()).await else { panic!("w2 opened a root of w1") };
        let err = err.to_string();
        assert!(err.contains("holds the resources of agent w1") && err.contains("not of w2"), "{err}");
        let again = opened_once_free(w1.clone()).await.expect("the same agent again, once the first process let go");
        assert_eq!(again.list().await.unwrap(), vec![], "the owner file is no handle");
        // Deleting the owner file neither frees the root (the lock is on the directory) nor lets the agent list it.
        std::fs::remove_file(root.join(OWNER_FILE)).unwrap();
        let err = DirDriver::new(&root).open(&w2).await.unwrap_err().to_string();
        assert!(err.contains("in use by another agent process"), "{err}");
        let err = again.list().await.unwrap_err().to_string();
        assert!(err.contains("not agent w1's any more") && err.contains("nothing is made, listed"), "{err}");
        std::fs::write(root.join(OWNER_FILE), "w2\n").unwrap();
        let err = again.list().await.unwrap_err().to_string();
        assert!(err.contains("names agent \"w2\", not w1"), "{err}");
        std::fs::write(root.join(OWNER_FILE), "w1\n").unwrap();
        assert_eq!(again.list().await.unwrap(), vec![], "back to its agent: listed again");
        // A root moved away (an unmounted disk) is not listed, and nothing is made there: the root is not made again.
        std::fs::rename(&root, tmp.path().join("moved")).unwrap();
        let err = again.list().await.unwrap_err().to_string();
        assert!(err.contains("not agent w1's any more"), "{err}");
        let err = again.create(id(5), &Spec::default()).await.unwrap_err();
        assert!(matches!(err, DriverError::Transient(_)), "{err}");
        assert!(!root.exists(), "the root is not made again by a create");
        assert!(again.destroy(id(5)).await.is_err() && again.check(id(5)).await.is_err());
        // Another directory at the same path, even one naming the agent (a copy, a bare mount point), is not it.
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join(OWNER_FILE), "w1\n").unwrap();
        let err = again.list().await.unwrap_err().to_string();
        assert!(err.contains("another directory than the one opened"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::rename(tmp.path().join("moved"), &root).unwrap();
        assert_eq!(again.list().await.unwrap(), vec![], "the very root is back");
        drop(again);

        // Roots do not nest, and a root is not named like a resource id (the agent of the root around it would take
        // it for a handle and destroy it).
        let err = DirDriver::new(root.join("inner")).open(&w2).await.unwrap_err().to_string();
        assert!(err.contains("roots do not nest"), "{err}");
        let err = DirDriver::new(tmp.path().join(id(9).to_string())).open(&w2).await.unwrap_err().to_string();
        assert!(err.contains("named like a resource id"), "{err}");

        let file = tmp.path().join("a-file");
        std::fs::write(&file, "not a directory").unwrap();
        let err = DirDriver::new(&file).open(&w1).await.unwrap_err().to_string();
        assert!(err.contains(&file.display().to_string()), "{err}");
    }

    /// A root whose file system hangs (here its owner file turned into a FIFO nobody writes: reading it blocks, as a
    /// hung NFS mount does) holds a thread for every call into it; past a few calls that outlived their caller, the
    /// driver starts no new one, so a pass every 30 s cannot fill the blocking pool. Once the calls return, it works
    /// again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_into_a_hung_root_are_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let w1 = AgentName::new("w1").unwrap();
        let driver = DirDriver::new(&root);
        driver.open(&w1).await.unwrap();
        let owner = root.join(OWNER_FILE);
        std::fs::remove_file(&owner).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&owner).status().expect("mkfifo runs");
        assert!(made.success());
        for _ in 0..MAX_STUCK_CALLS {
            let gave_up = tokio::time::timeout(Duration::from_millis(200), driver.list()).await;
            assert!(gave_up.is_err(), "the call hangs: {gave_up:?}");
        }
        assert_eq!(driver.stuck.load(Ordering::SeqCst), MAX_STUCK_CALLS);
        let refused = tokio::time::timeout(Duration::from_secs(5), driver.list()).await.expect("answered at once");
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("have not returned") && err.contains("nothing new is started"), "{err}");

        // The file system answers again: the hung readers get what is written and return.
        let fifo = owner.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let mut file = std::fs::OpenOptions::new().write(true).open(&fifo).expect("open the FIFO for writing");
            file.write_all(b"w1\n").expect("write");
        });
        tokio::time::timeout(Duration::from_secs(10), writer).await.expect("the readers were there").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while driver.stuck.load(Ordering::SeqCst) > 0 {
            assert!(tokio::time::Instant::now() < deadline, "the stuck calls returned");
            tokio::task::yield_now().await;
        }
        std::fs::remove_file(&owner).unwrap();
        std::fs::write(&owner, "w1\n").unwrap();
        assert_eq!(driver.list().await.unwrap(), vec![], "listed again");
    }

    #[tokio::test]
    async fn create_and_destroy_are_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = DirDriver::new(tmp.path());
        let native = driver.create(id(1), &Spec::default()).await.unwrap();
        assert_eq!(native, Some(driver.path_of(id(1)).display().to_string()));
        std::fs::write(driver.path_of(id(1)).join("data"), "kept").unwrap();
        assert_eq!(driver.create(id(1), &Spec::default()).await.unwrap(), native, "exists = ok");
        assert!(driver.path_of(id(1)).join("data").exists(), "a second create keeps what is inside");
        driver.destroy(id(1)).await.unwrap();
        assert!(!driver.path_of(id(1)).exists(), "destroy removes the directory and what is in it");
        driver.destroy(id(1)).await.unwrap();
        assert_eq!(driver.list().await.unwrap(), vec![]);
    }

    #[tokio::test]
    async fn a_name_taken_by_a_file_is_a_definitive_create_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = DirDriver::new(tmp.path());
        std::fs::write(driver.path_of(id(1)), "in the way").unwrap();
        let err = driver.create(id(1), &Spec::default()).await.unwrap_err();
        assert!(matches!(err, DriverError::CreateFailed(_)), "{err:?}");
    }

    #[tokio::test]
    async fn check_says_whether_the_directory_is_there_and_writable() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = DirDriver::new(tmp.path());
        let missing = driver.check(id(1)).await.unwrap();
        assert!(!missing.healthy, "{missing:?}");
        driver.create(id(1), &Spec::default()).await.unwrap();
        let present = driver.check(id(1)).await.unwrap();
        assert!(present.healthy, "{present:?}");
        assert!(!driver.path_of(id(1)).join(PROBE).exists(), "the probe is removed");
    }
}

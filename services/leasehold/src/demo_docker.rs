//! `leasehold demo --driver docker`: the demo's services with agents whose driver is the local Docker daemon. The
//! story on real containers and real addresses: the demo makes its own image without a registry (a static busybox,
//! imported), two agents register, a /29 pool gives containers addresses that `docker inspect` shows, `docker rm -f`
//! behind leasehold's back makes a resource `lost` and its address comes back after the cool-down, a container with an
//! agent's labels that the log never knew is destroyed on record, a container whose program exits is found failed,
//! checked and released, an image that is not on the machine fails its resource, and everything left is released.
//! At the end the demo removes what it made on the daemon (its network and, if it made it, its image) and says
//! whether leasehold left anything behind.
//!
//! The agents' names carry the run's id (`w1-<run>`): two demos, or a demo and a real agent, on one daemon never
//! take each other's containers for their own.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};
use leasehold_agent::AnyDriver;
use leasehold_agent::docker::{self, DockerDriver, LABEL_AGENT, LABEL_KIND, LABEL_RESOURCE};
use leasehold_schemas::command::{Allocate, DefinePool, Release};
use leasehold_schemas::ids::{Millis, PoolName, ResourceId};
use leasehold_schemas::pool::PoolKind;

use crate::demo::{Demo, DriverMaker, bound, name, until};

/// The label on everything the demo's agents make (and on what the demo makes by hand), with the run's id.
const LABEL_DEMO: &str = "io.leasehold.demo";
/// The pool's cool-down: short, so the story shows an address coming back without waiting long.
const COOLDOWN: Duration = Duration::from_secs(2);

/// What the demo set up on the daemon, to use and then remove.
pub(crate) struct Stage {
    docker: Docker,
    /// Six hex digits, different for every run.
    run: String,
    image: String,
    /// Whether this run imported the image (else it was there before, and stays).
    imported: bool,
    network: String,
    subnet: Ipv4Addr,
    agents: [String; 2],
}

impl Stage {
    /// Reaches the daemon (an error says how to start one) and makes the image.
    pub(crate) async fn prepare(out: &mut (dyn Write + Send)) -> anyhow::Result<Stage> {
        let docker = Docker::connect_with_local_defaults()
            .context("connecting to the local Docker daemon")?
            .negotiate_version()
            .await
            .context(
                "the local Docker daemon does not answer (is dockerd running, and may this user use its socket?)",
            )?;
        let run: String = ResourceId::generate().to_string().chars().rev().take(6).collect();
        let third = u8::from_str_radix(&run[..2], 16).unwrap_or(1);
        let busybox = docker::find_busybox().map_err(anyhow::Error::msg)?;
        let existed = images_like(&docker, "leasehold-busybox").await?;
        let image = docker::import_busybox_image("", &busybox).await.context("making the demo's image")?;
        let imported = !existed.contains(&image);
        writeln!(
            out,
            "leasehold demo on Docker: run {run}; image {image} ({} by `docker import` of {}, tagged by its content's \
             hash; nothing pulled)",
            if imported { "made now" } else { "already here" },
            busybox.display()
        )?;
        Ok(Stage {
            docker,
            network: format!("lh-demo-{run}"),
            subnet: Ipv4Addr::new(10, 199, third, 0),
            agents: [format!("w1-{run}"), format!("w2-{run}")],
            run,
            image,
            imported,
        })
    }

    /// The two agents' drivers: the local daemon, everything labelled with the run.
    pub(crate) fn agents(&self) -> [(String, DriverMaker); 2] {
        self.agents.clone().map(|name| {
            let run = self.run.clone();
            let make: DriverMaker = Box::new(move || {
                let driver = DockerDriver::new("")
                    .expect("the default endpoint parses")
                    .with_labels(BTreeMap::from([(LABEL_DEMO.to_owned(), run.clone())]))
                    .with_stop_timeout(Duration::from_secs(2));
                AnyDriver::Docker(driver)
            });
            (name, make)
        })
    }

    /// Removes what the run made on the daemon: anything still labelled with it (leasehold should have left none:
    /// the count is returned), its network, and its image if it made it.
    pub(crate) async fn clean_up(&self, out: &mut (dyn Write + Send)) -> anyhow::Result<usize> {
        let (containers, volumes) = self.left().await?;
        let left = containers.len() + volumes.len();
        for name in &containers {
            let force = RemoveContainerOptions { force: true, v: true, ..Default::default() };
            self.docker.remove_container(name, Some(force)).await.with_context(|| format!("removing {name}"))?;
        }
        for name in &volumes {
            let options = RemoveVolumeOptions { force: true };
            self.docker.remove_volume(name, Some(options)).await.with_context(|| format!("removing volume {name}"))?;
        }
        match self.docker.remove_network(&self.network).await {
            Ok(()) => {}
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("removing network {}", self.network)),
        }
        if self.imported {
            self.docker
                .remove_image(&self.image, None::<bollard::query_parameters::RemoveImageOptions>, None)
                .await
                .with_context(|| format!("removing {}", self.image))?;
        }
        writeln!(
            out,
            "   on the daemon: {} left by leasehold{}; the demo removed its network {}{}",
            if left == 0 { "nothing".to_owned() } else { format!("{left} object(s)") },
            if left == 0 { "" } else { " (removed now)" },
            self.network,
            if self.imported { format!(" and its image {}", self.image) } else { String::new() }
        )?;
        out.flush()?;
        Ok(left)
    }

    /// The containers and volumes labelled with this run.
    async fn left(&self) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_DEMO}={}", self.run)])]);
        let options = ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() };
        let containers = self.docker.list_containers(Some(options)).await.context("listing containers")?;
        let volumes = self.docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })).await?;
        let containers =
            containers.into_iter().filter_map(|c| c.names?.first().map(|n| n.trim_start_matches('/').to_owned()));
        let volumes = volumes.volumes.unwrap_or_default().into_iter().map(|v| v.name);
        Ok((containers.collect(), volumes.collect()))
    }

    /// One line on a container as the daemon has it: its state and its address on the demo's network.
    async fn describe(&self, id: ResourceId) -> anyhow::Result<String> {
        let name = format!("lh-{id}");
        let found = match self.docker.inspect_container(&name, None::<InspectContainerOptions>).await {
            Ok(found) => found,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                return Ok(format!("docker: no container {name}"));
            }
            Err(e) => return Err(e).context("docker inspect"),
        };
        let state = found.state.as_ref().and_then(|s| s.status).map_or("?".to_owned(), |s| s.to_string());
        let address = self.address_of(&found);
        Ok(format!(
            "docker: {name} {state}{}",
            address.map(|a| format!(", {a} on network {}", self.network)).unwrap_or_default()
        ))
    }

    fn address_of(&self, found: &bollard::models::ContainerInspectResponse) -> Option<String> {
        let networks = found.network_settings.as_ref()?.networks.as_ref()?;
        networks.get(&self.network)?.ip_address.clone().filter(|a| !a.is_empty())
    }

    async fn address(&self, id: ResourceId) -> anyhow::Result<Option<String>> {
        let found = self.docker.inspect_container(&format!("lh-{id}"), None::<InspectContainerOptions>).await?;
        Ok(self.address_of(&found))
    }

    async fn exists(&self, name: &str) -> anyhow::Result<bool> {
        match self.docker.inspect_container(name, None::<InspectContainerOptions>).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
            Err(e) => Err(e).context("docker inspect"),
        }
    }
}

impl Demo<'_> {
    /// The story on Docker (see the module's documentation).
    pub(crate) async fn docker_script(&mut self, stage: &Stage) -> anyhow::Result<()> {
        let [w1, w2] = stage.agents.clone();
        writeln!(
            self.out,
            "the real services on a temporary directory, and two agents ({w1}, {w2}) on the local Docker daemon: \
             their containers are named lh-<id> and labelled {LABEL_AGENT}=<agent>, {LABEL_DEMO}={}",
            stage.run
        )?;
        self.chapter("two agents start and register: the position of each registration is its epoch")?;
        for agent in [&w1, &w2] {
            self.until_agent(agent, "live").await?;
        }
        self.print_through(self.latest().await?).await?;

        let pool = PoolName::new("demo-net").context("a pool name")?;
        let gateway = Ipv4Addr::from(u32::from(stage.subnet) + 1);
        self.chapter(&format!(
            "a pool of addresses, {}/29 without {gateway} (the network's gateway); a freed address cools down {}",
            stage.subnet,
            humantime::format_duration(COOLDOWN)
        ))?;
        let kind = PoolKind::Ipv4 { network: stage.subnet, prefix_len: 29, exclude: vec![gateway] };
        let cooldown = Some(Millis(COOLDOWN.as_millis() as u64));
        self.submit(
            "op:netops",
            DefinePool { pool: pool.clone(), kind, cooldown, orphans: leasehold_schemas::pool::OrphanPolicy::Release },
        )
        .await?;
        self.print_through(self.latest().await?).await?;

        self.chapter(&format!(
            "two containers on {w1} with an address each: the agent makes network {} and puts each on its address",
            stage.network
        ))?;
        let mut held = Vec::new();
        for _ in 0..2 {
            let id = self.allocate_container(stage, &w1, &["sleep", "600"], Some(&pool)).await?;
            let view = self.until_state(&w1, id, "active").await?;
            let granted = bound(&view).context("an active container holds its address")?;
            held.push((id, granted));
        }
        self.print_through(self.latest().await?).await?;
        let mut real = true;
        for (id, granted) in &held {
            let line = stage.describe(*id).await?;
            writeln!(self.out, "   ({line}; leasehold granted {granted})")?;
            real &= stage.address(*id).await?.as_deref() == Some(granted.as_str());
        }
        self.summary.addresses_real = real;

        self.chapter(&format!("a volume on {w2}: a Docker volume lh-<id>"))?;
        let volume = self.allocate_kind(&w2, "volume", BTreeMap::new(), None).await?;
        self.until_state(&w2, volume, "active").await?;
        self.print_through(self.latest().await?).await?;

        let (gone, gone_address) = held[0].clone();
        self.chapter("someone runs `docker rm -f` on the first container: lost at the next report, its address freed to cool down")?;
        let force = RemoveContainerOptions { force: true, ..Default::default() };
        stage.docker.remove_container(&format!("lh-{gone}"), Some(force)).await.context("docker rm -f")?;
        writeln!(self.out, "   (docker rm -f lh-{gone})")?;
        self.sync(0);
        self.until_state(&w1, gone, "lost").await?;
        self.summary.lost_detected = true;
        let gateway_client = self.gateway();
        until(&format!("{gone_address} freed"), || {
            let gateway_client = gateway_client.clone();
            async move {
                let pools: Vec<leasehold_projector::PoolView> =
                    gateway_client.get(&["v1", "pools"], &[]).await?.unwrap_or_default();
                Ok(pools.into_iter().find(|p| p.name == "demo-net" && p.held == 1 && p.cooling == 1).map(|_| ()))
            }
        })
        .await?;
        self.print_through(self.latest().await?).await?;

        self.chapter(&format!("a container with {w1}'s labels that the log never knew: reported, ordered destroyed"))?;
        let stray = ResourceId::generate();
        let stray_name = format!("lh-{stray}");
        let labels = HashMap::from([
            (LABEL_AGENT.to_owned(), w1.clone()),
            (LABEL_RESOURCE.to_owned(), stray.to_string()),
            (LABEL_KIND.to_owned(), "container".to_owned()),
            (LABEL_DEMO.to_owned(), stage.run.clone()),
        ]);
        let body = ContainerCreateBody { image: Some(stage.image.clone()), labels: Some(labels), ..Default::default() };
        let options = CreateContainerOptions { name: Some(stray_name.clone()), ..Default::default() };
        stage.docker.create_container(Some(options), body).await.context("docker create")?;
        stage.docker.start_container(&stray_name, None).await.context("docker start")?;
        writeln!(self.out, "   (docker run --label {LABEL_AGENT}={w1} ... --name {stray_name})")?;
        self.sync(0);
        until(&format!("{stray_name} removed"), || async { Ok((!stage.exists(&stray_name).await?).then_some(())) })
            .await?;
        self.summary.garbage_destroyed = true;
        self.print_through(self.latest().await?).await?;
        writeln!(self.out, "   ({stray_name} is gone: the agent destroyed it as the log ordered, and said so)")?;

        self.chapter("a container whose program exits with code 3: found failed, checked unhealthy, released")?;
        let exits = self.allocate_container(stage, &w2, &["sh", "-c", "sleep 1; exit 3"], None).await?;
        self.until_state(&w2, exits, "active").await?;
        self.sync(1);
        let released = self.until_state(&w2, exits, "destroyed").await?;
        self.summary.exit_released = released.detail.as_ref().is_some_and(|d| d.to_string().contains("code 3"));
        self.print_through(self.latest().await?).await?;

        self.chapter("a container of an image that is not on this machine: failed, with the reason (nothing pulled)")?;
        let attributes = BTreeMap::from([("image".to_owned(), "leasehold-demo-missing:latest".to_owned())]);
        let missing = self.allocate_kind(&w2, "container", attributes, None).await?;
        let failed = self.until_state(&w2, missing, "failed").await?;
        self.summary.missing_image_failed =
            failed.detail.as_ref().is_some_and(|d| d.to_string().contains("leasehold never pulls"));
        self.print_through(self.latest().await?).await?;

        self.chapter("everything left is released: each agent stops and removes what it made, on record")?;
        let (kept, _) = held[1].clone();
        for (agent, id) in [(&w1, kept), (&w2, volume)] {
            self.submit(
                "op:ci-scheduler",
                Release { agent: name(agent), resource: id, reason: Some("demo done".into()) },
            )
            .await?;
        }
        self.sync(0);
        self.sync(1);
        self.until_state(&w1, kept, "destroyed").await?;
        self.until_state(&w2, volume, "destroyed").await?;
        self.print_through(self.latest().await?).await?;
        writeln!(self.out, "   ({})", stage.describe(kept).await?)?;
        Ok(())
    }

    async fn allocate_container(
        &self,
        stage: &Stage,
        agent: &str,
        cmd: &[&str],
        pool: Option<&PoolName>,
    ) -> anyhow::Result<ResourceId> {
        let mut attributes = BTreeMap::from([
            ("image".to_owned(), stage.image.clone()),
            ("cmd".to_owned(), serde_json::to_string(cmd)?),
            ("memory".to_owned(), "64m".to_owned()),
        ]);
        if pool.is_some() {
            attributes.insert("network".to_owned(), stage.network.clone());
        }
        self.allocate_kind(agent, "container", attributes, pool).await
    }

    async fn allocate_kind(
        &self,
        agent: &str,
        kind: &str,
        attributes: BTreeMap<String, String>,
        pool: Option<&PoolName>,
    ) -> anyhow::Result<ResourceId> {
        let resource = ResourceId::generate();
        let body = Allocate {
            agent: name(agent),
            resource,
            kind: kind.to_owned(),
            capacity: 1,
            attributes,
            parent: None,
            pools: pool.into_iter().cloned().collect(),
            wait: None,
        };
        let status = self.submit("op:ci-scheduler", body).await?;
        if let Some(rejection) = status.rejection {
            bail!("the allocation on {agent} was rejected: {}: {}", rejection.kind, rejection.message);
        }
        Ok(resource)
    }
}

/// The tags of local images of `repository`.
async fn images_like(docker: &Docker, repository: &str) -> anyhow::Result<Vec<String>> {
    let images = docker
        .list_images(None::<bollard::query_parameters::ListImagesOptions>)
        .await
        .context("listing local images")?;
    Ok(images
        .into_iter()
        .flat_map(|image| image.repo_tags)
        .filter(|tag| tag.starts_with(&format!("{repository}:")))
        .collect())
}

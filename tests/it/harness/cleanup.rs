//! Removing everything one sandboxd instance made, by its label. Shared by
//! the test harness and the benchmarks (bench/support.rs includes this file).

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

/// Removes every container, volume and network labelled with `instance`.
/// An engine call the stopped sandboxd sent just before it exited can
/// still make an object after the first pass has listed: passes repeat
/// (for at most 3 s) until one finds nothing.
pub async fn remove_instance_objects(docker: &Docker, instance: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while remove_pass(docker, instance).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// One pass of `remove_instance_objects`; how many objects it found.
async fn remove_pass(docker: &Docker, instance: &str) -> usize {
    let mut found = 0;
    let filter = HashMap::from([(
        "label".to_string(),
        vec![format!("sandboxd.instance={instance}")],
    )]);
    if let Ok(list) = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filter.clone()),
            ..Default::default()
        }))
        .await
    {
        found += list.len();
        for c in list {
            if let Some(id) = c.id {
                let _ = docker
                    .remove_container(
                        &id,
                        Some(RemoveContainerOptions {
                            force: true,
                            ..Default::default()
                        }),
                    )
                    .await;
            }
        }
    }
    if let Ok(list) = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(filter.clone()),
        }))
        .await
    {
        let volumes = list.volumes.unwrap_or_default();
        found += volumes.len();
        for v in volumes {
            let _ = docker
                .remove_volume(&v.name, Some(RemoveVolumeOptions { force: true }))
                .await;
        }
    }
    if let Ok(list) = docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(filter),
        }))
        .await
    {
        found += list.len();
        for n in list {
            if let Some(name) = n.name {
                let _ = docker.remove_network(&name).await;
            }
        }
    }
    found
}

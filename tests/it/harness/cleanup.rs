//! Removing everything one sandboxd instance made, by its label. Shared by
//! the test harness and the benchmarks (bench/support.rs includes this file).

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

/// Removes every container, volume and network labelled with `instance`.
pub async fn remove_instance_objects(docker: &Docker, instance: &str) {
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
        for v in list.volumes.unwrap_or_default() {
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
        for n in list {
            if let Some(name) = n.name {
                let _ = docker.remove_network(&name).await;
            }
        }
    }
}

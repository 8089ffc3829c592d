//! The worker's Pod: reading, creating, replacing and deleting it, and writing its status.

use super::*;

impl Worker {
    /// The Pod, if any; `None` when the agent shut down before it could be read.
    pub(super) async fn get_pod(&self) -> Option<Option<Pod>> {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match api.get_opt(&self.pod).await {
                Ok(pod) => {
                    tracing::debug!(pod = %self.pod, exists = pod.is_some(), "pod read");
                    return Some(pod);
                }
                Err(error) => {
                    if !retry.again(&self.shared, "read pod", &error).await {
                        return None;
                    }
                }
            }
        }
    }

    /// The Pod object of this replica for this run (no status).
    pub(super) fn new_pod(&self) -> Pod {
        let mut pod = replica_pod(&self.task, self.index, &self.key);
        // The Task was read from this namespace.
        pod.metadata.namespace = Some(self.shared.namespace.clone());
        pod.spec.task_namespace = Some(self.shared.namespace.clone());
        pod.spec.pod_namespace = Some(self.shared.namespace.clone());
        pod
    }

    /// Create this run's Pod, expecting none: `Some(true)` when created, `Some(false)` when
    /// a Pod of that name exists, `None` when the agent shut down first (other errors are
    /// retried).
    pub(super) async fn create_new_pod(&self) -> Option<bool> {
        self.try_create_pod(false).await
    }

    /// Create this run's Pod; one of another run in the way is deleted first. Returns
    /// false only when the agent shut down first.
    pub(super) async fn create_pod(&self) -> bool {
        self.try_create_pod(true).await == Some(true)
    }

    /// Create this run's Pod, retrying errors: `Some(true)` once it exists and is this
    /// run's, `None` when the agent shut down first. A Pod already there (409): with
    /// `replace`, adopted when it is ours, else deleted and the create retried; without,
    /// `Some(false)` at once.
    pub(super) async fn try_create_pod(&self, replace: bool) -> Option<bool> {
        let api = self.shared.pods();
        let pod = self.new_pod();
        let mut retry = Retry::new();
        loop {
            let error = match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, "pod created");
                    return Some(true);
                }
                Err(error) if is_status(&error, 409) && !replace => return Some(false),
                Err(error) if is_status(&error, 409) => match api.get_opt(&self.pod).await {
                    Ok(Some(existing)) if self.is_ours(&existing) => return Some(true),
                    Ok(Some(existing)) => match delete_pod(&api, &existing).await {
                        Ok(()) => error,
                        Err(e) => e,
                    },
                    Ok(None) => error,
                    Err(e) => e,
                },
                Err(error) => error,
            };
            if !retry.again(&self.shared, "create pod", &error).await {
                return None;
            }
        }
    }

    /// Delete `pod`; false only when the agent shut down first.
    pub(super) async fn delete_pod(&self, pod: &Pod) -> bool {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match delete_pod(&api, pod).await {
                Ok(()) => return true,
                Err(error) => {
                    if !retry.again(&self.shared, "delete pod", &error).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Delete this run's Pod (not one another run or node put under the same name).
    pub(super) async fn delete_own_pod(&self) {
        if let Some(Some(pod)) = self.get_pod().await
            && self.is_ours(&pod)
        {
            self.delete_pod(&pod).await;
        }
    }

    /// Merge-patch the Pod's status with `patch` (retried). With `recreate`, a Pod that
    /// disappeared is created again with everything reported so far. Returns whether the
    /// write happened.
    pub(super) async fn write_status(&mut self, mut patch: StatusPatch, recreate: bool) -> bool {
        if let Some(board) = self.pending_tensorboard.take() {
            patch.set.tensor_board = Some(*board);
            self.clear_tensorboard = false;
        }
        if std::mem::take(&mut self.clear_tensorboard) && patch.set.tensor_board.is_none() {
            patch.clear.push(StatusField::TensorBoard);
        }
        patch.apply(&mut self.reported);
        let api = self.shared.pods();
        let params = PatchParams::default();
        let body = json!({ "status": patch.to_json() });
        let mut retry = Retry::new();
        loop {
            let error = match api
                .patch_status(&self.pod, &params, &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, phase = ?patch.phase(), "pod status written");
                    return true;
                }
                Err(error) if is_status(&error, 404) && !recreate => return false,
                Err(error) if is_status(&error, 404) => {
                    if !self.create_pod().await {
                        return false;
                    }
                    let full = json!({ "status": self.reported });
                    match api
                        .patch_status(&self.pod, &params, &Patch::Merge(&full))
                        .await
                    {
                        Ok(_) => return true,
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if !retry.again(&self.shared, "write pod status", &error).await {
                return false;
            }
        }
    }
}

//! `wait` as an MCP task (docs/agents.md#mcp): a client that sends `tools/call` for `wait`
//! with a `task` field gets a task at once instead of a call that blocks; it reads the
//! task with `tasks/get`, takes the result with `tasks/result` (which blocks until the
//! wait ends, as the spec says) or ends the wait with `tasks/cancel`. The tasks are the
//! ones of the protocol as rmcp 2.2 speaks it (task-augmented requests, tasks/get, result,
//! cancel, list); only `wait` takes them, the other tools answer at once anyway.
//!
//! When a wait ends the client is sent `notifications/tasks/status` with the task, so it
//! need not poll. The wait itself is [`super::wait_tool`], unchanged: run here with a cancellation of the
//! task's own (the call's own ends with its `CreateTaskResult`), so it sends its progress
//! for the call's progress token and stops between two steps when the task is cancelled.

use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelTaskResult, CreateTaskResult,
    GetTaskPayloadResult, GetTaskResult, ListTasksResult, RelatedTaskMetadata, ServerNotification,
    Task, TaskStatus, TaskStatusNotification, TaskStatusNotificationParam,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::current_timestamp;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a task is kept when the client asks for no `ttl` (ms): an hour.
const DEFAULT_TTL_MS: u64 = 3_600_000;
/// The longest `ttl` granted (ms): two days, above the longest `wait` (a day).
const MAX_TTL_MS: u64 = 2 * 86_400_000;
/// A finished task is kept at least this long after it finished, whatever its ttl, so a
/// client polling at `POLL_MS` sees its end.
const KEEP_AFTER_END: Duration = Duration::from_secs(60);
/// The poll interval suggested to the client (ms).
const POLL_MS: u64 = 1000;
/// Waits running as tasks at once, per server: one more is refused, so a client in a loop
/// cannot pile up blocked threads and ctl requests without bound.
const MAX_RUNNING: usize = 64;

/// One task: its state for `tasks/get`, its outcome once it has one.
struct Entry {
    task: Task,
    created: Instant,
    ended: Option<Instant>,
    /// The outcome: the tool's result, or the protocol error the call would have had.
    outcome: Option<Result<CallToolResult, McpError>>,
    /// Ends the running wait.
    cancel: Box<dyn Fn() + Send + Sync>,
    /// Flips to true when the task reaches a terminal status.
    done: watch::Sender<bool>,
}

impl Entry {
    fn terminal(&self) -> bool {
        !matches!(
            self.task.status,
            TaskStatus::Working | TaskStatus::InputRequired
        )
    }

    /// Set the terminal status (once; a later outcome of a cancelled wait is dropped).
    fn finish(&mut self, status: TaskStatus, message: String) {
        if self.terminal() {
            return;
        }
        self.task.status = status;
        self.task.status_message = Some(message);
        self.task.last_updated_at = current_timestamp();
        self.ended = Some(Instant::now());
        let _ = self.done.send(true);
    }
}

/// The server's tasks.
#[derive(Default)]
pub struct Tasks {
    entries: Mutex<HashMap<String, Entry>>,
    next: AtomicU64,
}

pub type Shared = Arc<Tasks>;

fn no_task(id: &str) -> McpError {
    McpError::invalid_params(
        format!("no task {id:?} (unknown, or its ttl passed); `tasks/list` lists the tasks"),
        None,
    )
}

fn status_word(s: &TaskStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{s:?}"))
}

impl Tasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // a panic while holding the lock leaves plain data behind: go on with it
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drop the finished tasks whose time is up.
    fn purge(map: &mut HashMap<String, Entry>) {
        let now = Instant::now();
        map.retain(|_, e| match e.ended {
            None => true,
            Some(end) => {
                let ttl = Duration::from_millis(e.task.ttl.unwrap_or(DEFAULT_TTL_MS));
                now < e.created + ttl || now < end + KEEP_AFTER_END
            }
        });
    }
}

/// `tools/call` with a `task`: start the wait, answer with the task.
pub async fn enqueue(
    tasks: &Shared,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CreateTaskResult, McpError> {
    if request.name != "wait" {
        return Err(McpError::invalid_params(
            format!(
                "`{}` does not run as a task; call it without `task`",
                request.name
            ),
            None,
        ));
    }
    let ttl = request
        .task
        .as_ref()
        .and_then(|t| t.ttl)
        .unwrap_or(DEFAULT_TTL_MS)
        .min(MAX_TTL_MS);
    // the wait gets a cancellation of its own: the call's ends when its answer is sent
    let mut ctx = context.clone();
    ctx.ct = Default::default();
    let ct = ctx.ct.clone();
    let (done, _) = watch::channel(false);
    let id = format!(
        "wait-{}-{:x}",
        tasks.next.fetch_add(1, Ordering::Relaxed) + 1,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let now = current_timestamp();
    let task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
        .with_status_message("waiting")
        .with_ttl(ttl)
        .with_poll_interval(POLL_MS);
    {
        let mut map = tasks.lock();
        Tasks::purge(&mut map);
        let running = map.values().filter(|e| !e.terminal()).count();
        if running >= MAX_RUNNING {
            return Err(McpError::invalid_request(
                format!(
                    "{running} waits are running as tasks, the most this server runs; \
                     cancel one (`tasks/cancel`) or wait for one to end"
                ),
                None,
            ));
        }
        map.insert(
            id.clone(),
            Entry {
                task: task.clone(),
                created: Instant::now(),
                ended: None,
                outcome: None,
                cancel: Box::new(move || ct.cancel()),
                done,
            },
        );
    }
    let args = request.arguments.unwrap_or_default();
    let store = tasks.clone();
    let run_id = id.clone();
    let peer = ctx.peer.clone();
    tokio::spawn(async move {
        let outcome = super::wait_tool(args, ctx).await;
        let ended = {
            let mut map = store.lock();
            let Some(e) = map.get_mut(&run_id) else {
                return;
            };
            if e.terminal() {
                return; // cancelled meanwhile: the cancel said the last word
            }
            let (status, message) = match &outcome {
                Ok(r) if r.is_error != Some(true) => {
                    (TaskStatus::Completed, "the wait ended".into())
                }
                Ok(r) => (TaskStatus::Failed, first_text(r)),
                Err(e) => (TaskStatus::Failed, e.message.to_string()),
            };
            e.outcome = Some(outcome);
            e.finish(status, message);
            e.task.clone()
        };
        // the client need not poll: it hears the end (the spec's optional status
        // notification); a client gone meanwhile is no error of the task's
        let note = TaskStatusNotification::new(TaskStatusNotificationParam::new(ended));
        let _ = peer
            .send_notification(ServerNotification::TaskStatusNotification(note))
            .await;
    });
    Ok(CreateTaskResult::new(task))
}

/// The first line of a result's text, for the status message.
fn first_text(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.lines().next().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// `tasks/get`.
pub fn get(tasks: &Shared, id: &str) -> Result<GetTaskResult, McpError> {
    let mut map = tasks.lock();
    Tasks::purge(&mut map);
    map.get(id)
        .map(|e| GetTaskResult::new(e.task.clone()))
        .ok_or_else(|| no_task(id))
}

/// `tasks/list`: every task kept, oldest first.
pub fn list(tasks: &Shared) -> ListTasksResult {
    let mut map = tasks.lock();
    Tasks::purge(&mut map);
    let mut all: Vec<(Instant, Task)> = map.values().map(|e| (e.created, e.task.clone())).collect();
    all.sort_by_key(|(c, _)| *c);
    ListTasksResult::new(all.into_iter().map(|(_, t)| t).collect())
}

/// `tasks/cancel`: end the wait; the task is `cancelled` before the answer goes out.
pub fn cancel(tasks: &Shared, id: &str) -> Result<CancelTaskResult, McpError> {
    let mut map = tasks.lock();
    Tasks::purge(&mut map);
    let e = map.get_mut(id).ok_or_else(|| no_task(id))?;
    if e.terminal() {
        return Err(McpError::invalid_params(
            format!(
                "task {id:?} is already {}; only a working task can be cancelled",
                status_word(&e.task.status)
            ),
            None,
        ));
    }
    (e.cancel)();
    e.finish(TaskStatus::Cancelled, "cancelled by the client".into());
    Ok(CancelTaskResult::new(e.task.clone()))
}

/// `tasks/result`: the wait's result once it ended (blocking until then), with the task
/// named in its `_meta`; a cancelled task has none.
pub async fn result(
    tasks: &Shared,
    id: &str,
    context: RequestContext<RoleServer>,
) -> Result<GetTaskPayloadResult, McpError> {
    let mut rx = {
        let mut map = tasks.lock();
        Tasks::purge(&mut map);
        map.get(id).ok_or_else(|| no_task(id))?.done.subscribe()
    };
    loop {
        if *rx.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = context.ct.cancelled() => {
                return Err(McpError::new(rmcp::model::ErrorCode(-32800), "request cancelled", None));
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    return Err(no_task(id)); // dropped meanwhile
                }
            }
        }
    }
    let map = tasks.lock();
    let e = map.get(id).ok_or_else(|| no_task(id))?;
    match &e.outcome {
        Some(Ok(r)) => {
            let mut v = serde_json::to_value(r)
                .map_err(|err| McpError::internal_error(err.to_string(), None))?;
            if let Value::Object(o) = &mut v {
                let meta = o.entry("_meta").or_insert_with(|| json!({}));
                if let Value::Object(m) = meta {
                    m.insert(
                        RelatedTaskMetadata::META_KEY.into(),
                        json!({ "taskId": id }),
                    );
                }
            }
            Ok(GetTaskPayloadResult::new(v))
        }
        Some(Err(err)) => Err(err.clone()),
        None => Err(McpError::invalid_params(
            format!(
                "task {id:?} was {} and has no result",
                status_word(&e.task.status)
            ),
            None,
        )),
    }
}

"""doq_client: the Python client of doq (gRPC), sync and asyncio.

Depends only on grpcio and protobuf. Entry points:
- `DoqClient` / `AsyncDoqClient`: unary calls (queues, enqueue, dequeue, ack, ...);
- `Producer` / `AsyncProducer`: pipelined enqueues with a window, over streams;
- `Consumer` / `AsyncConsumer`: prefetching consumers with acks in the stream;
- `Worker` / `AsyncWorker` (from `client.worker(queue, handler, concurrency=N)`): a handler
  run with a concurrency, its leases kept, retried with `Backoff`, stopped gracefully;
- errors: `DoqClientError` and subclasses (`doq_client.errors`);
- `FailoverPolicy`: how long calls and streams look for the leader (on by default);
- `RetryPolicy`: optional bounded retry of other retryable unary failures.
Every client takes `key=` (default `$DOQ_KEY`), sent as `authorization: Bearer KEY`.
"""

from doq_client._auth import aio_interceptors as key_interceptors
from doq_client._redrive import RedriveTask
from doq_client._worker_core import Backoff, WorkerHooks
from doq_client.aio import AsyncDoqClient
from doq_client.aio_producer import AsyncProducer
from doq_client.aio_worker import AsyncWorker
from doq_client.client import DoqClient
from doq_client.consumer import AsyncConsumer, Consumer
from doq_client.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    DoqClientError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MessageNotFound,
    NotFound,
    NotLeader,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    QueueNotFound,
    ResourceExhausted,
    StaleLease,
    StorageFull,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from doq_client.producer import Producer
from doq_client.retry import FailoverPolicy, RetryPolicy
from doq_client.types import (
    AckResult,
    EnqueueResult,
    GroupInfo,
    Message,
    Queue,
    QueueSettings,
    QueueStats,
    enqueue_request,
)
from doq_client.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AckResult",
    "AlreadyExists",
    "AsyncConsumer",
    "AsyncDoqClient",
    "AsyncProducer",
    "AsyncWorker",
    "Backoff",
    "Cancelled",
    "Consumer",
    "DeadlineExceeded",
    "DoqClient",
    "DoqClientError",
    "EnqueueResult",
    "FailoverPolicy",
    "FailedPrecondition",
    "GroupInfo",
    "Internal",
    "InvalidArgument",
    "Message",
    "MessageNotFound",
    "NotFound",
    "NotLeader",
    "OutcomeUnknown",
    "Overloaded",
    "PermissionDenied",
    "Producer",
    "Queue",
    "RedriveTask",
    "QueueNotFound",
    "QueueSettings",
    "QueueStats",
    "ResourceExhausted",
    "RetryPolicy",
    "StaleLease",
    "StorageFull",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "Worker",
    "WorkerHooks",
    "enqueue_request",
    "key_interceptors",
]

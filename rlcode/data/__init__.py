"""Task types and tfds builders (array_record, no TensorFlow needed)."""

from rlcode.data.tasks import Task, TaskBuilder, load_tasks

__all__ = ["Task", "TaskBuilder", "load_tasks"]

"""Task data: grain datasets and checkpointable iterators of environment tasks."""

from tunix_agentic.data.tasks import heldout_tasks, task_dataset, task_iterator

__all__ = ["heldout_tasks", "task_dataset", "task_iterator"]

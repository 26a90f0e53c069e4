"""Training (no Qt): tasks, schedules, optimisers and the loop that emits metric events."""
from .schedules import SCHEDULES, lr_at
from .optim import OPTIMIZERS, Lion, make_optimizer
from .tasks import Batch, Task, TaskError, make_task, task_names
from . import seq2seq_tasks  # noqa: F401 - declares translate and the encoder-decoder copy, reverse, sort
from . import image_tasks  # noqa: F401 - declares the image tasks (after the others: the task list's order)
from .trainer import TrainConfig, TrainControl, TrainingDiverged, checkpoint_step, model_config_for, train

__all__ = ["SCHEDULES", "lr_at", "OPTIMIZERS", "Lion", "make_optimizer", "task_names", "Batch", "Task", "TaskError",
           "make_task", "TrainConfig", "TrainControl", "TrainingDiverged", "checkpoint_step", "model_config_for",
           "train"]

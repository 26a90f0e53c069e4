"""Training (no Qt): tasks, schedules, optimisers and the loop that emits metric events."""
from .schedules import SCHEDULES, lr_at
from .optim import OPTIMIZERS, Lion, make_optimizer
from .tasks import TASKS, Batch, Task, TaskError, make_task
from .trainer import TrainConfig, TrainControl, TrainingDiverged, checkpoint_step, model_config_for, train

__all__ = ["SCHEDULES", "lr_at", "OPTIMIZERS", "Lion", "make_optimizer", "TASKS", "Batch", "Task", "TaskError",
           "make_task", "TrainConfig", "TrainControl", "TrainingDiverged", "checkpoint_step", "model_config_for",
           "train"]

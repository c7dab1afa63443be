"""Running a schedule on one worker within one epoch: process groups, held layers, executor."""

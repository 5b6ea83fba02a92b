"""Every setting of a run, in one package.

A setting's value is decided in this order, each step overriding the one before:

1. the default in its section dataclass (model.py, data.py, train.py for `train` and
   `optim`, decode.py, parallel.py);
2. the recipe: the config file's `get_config(arg)` (configs/*.py, built on recipes.py);
3. the variant the file's `:variant=…` argument names (variants.py: base, big, Table 3);
4. `runlocal=true`, where a recipe takes it (recipes.shrink_for_cpu);
5. `--config.section.key=value` on the command line (overrides.py reads the text as the
   key's type);
6. for translate and evaluate, the decode flags (`--beam`, `--alpha`, …), over the run's
   own decode section.

`load_experiment(spec, overrides)` runs steps 2-5 and returns the checked `Experiment`
(experiment.py); typed.py checks each key's type from the dataclass's type hints, and each
dataclass its ranges. xla.py holds the compiler options a section may set.
"""

from attnmt.config.experiment import Experiment
from attnmt.config.files import load_config_file, load_config_module, load_experiment

__all__ = ["Experiment", "load_config_file", "load_config_module", "load_experiment"]

"""Migration from the older MindFormers configuration (run_xxx.yaml) to the new training YAML.

    from mf_config import migrate_legacy
    result = migrate_legacy("run_llama2_7b.yaml")
    cfg = result.validate()                 # a TrainConfig (ConfigError if it does not validate)
    print(result.to_yaml())                 # the new YAML
    for line in result.sorted_report():     # every key not copied verbatim, and why
        print(line)

Modules: `engine` (entry point, format detection, final sweep), one `*_rules` module per area
(model, parallel, memory, dataset, optim, run), `tables` / `model_tables` (the rules as data),
`session` (shared state), `source` (key bookkeeping), `report` (result types).
"""

from mf_config.legacy.engine import migrate_legacy
from mf_config.legacy.report import MigrationResult, ReportLine

__all__ = ["MigrationResult", "ReportLine", "migrate_legacy"]

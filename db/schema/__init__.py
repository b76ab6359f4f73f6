"""The tables, one module per concept (jobs, the fleet, the model store, schedules, users,
webhooks, the OpenLineage export), on one declarative base whose metadata the migrations are
compared with. Importers take the tables and the time helpers from here: importing the package
registers every table.

Imports (of mxq): core.
"""

from mxq.db.schema.base import NEVER_REUSE_IDS, Base, as_utc, iso, utcnow
from mxq.db.schema.fleet import StackRow, WorkerBeat
from mxq.db.schema.jobs import Epoch, Job, JobEvent, JobLogLine, JobMetric, Prediction
from mxq.db.schema.lineage import OpenLineageCursor, OpenLineageRun
from mxq.db.schema.registry import Arch, Model
from mxq.db.schema.schedules import Fire, Schedule, ScoredInput
from mxq.db.schema.users import LoginSession, Team, TeamMember, User
from mxq.db.schema.webhooks import Hook, HookDelivery

__all__ = ["NEVER_REUSE_IDS", "Arch", "Base", "Epoch", "Fire", "Hook", "HookDelivery", "Job",
           "JobEvent", "JobLogLine", "JobMetric", "LoginSession", "Model", "OpenLineageCursor",
           "OpenLineageRun", "Prediction", "Schedule", "ScoredInput", "StackRow", "Team",
           "TeamMember", "User", "WorkerBeat", "as_utc", "iso", "utcnow"]

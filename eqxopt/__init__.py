"""eqxopt: Equinox-native optimizers for JAX, with typed state that never drifts."""

import importlib.metadata as _metadata

from . import schedules as schedules
from ._base import (
    AbstractOptimizer as AbstractOptimizer,
    child_update as child_update,
    CountState as CountState,
    EmptyState as EmptyState,
    StateDriftError as StateDriftError,
)
from ._checkpoint import (
    check_checkpoint as check_checkpoint,
    CheckpointMismatchError as CheckpointMismatchError,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._interop import (
    from_optax as from_optax,
    FromOptax as FromOptax,
    FromOptaxState as FromOptaxState,
    to_optax as to_optax,
)
from ._linesearch import (
    AbstractLineSearch as AbstractLineSearch,
    LineSearchResult as LineSearchResult,
)
from ._linesearch.backtracking import (
    Backtracking as Backtracking,
    BacktrackingState as BacktrackingState,
)
from ._linesearch.zoom import Zoom as Zoom, ZoomState as ZoomState
from ._minimize import minimize as minimize
from ._optimizers.acprop import AcProp as AcProp, AcPropState as AcPropState
from ._optimizers.adadelta import (
    Adadelta as Adadelta,
    AdadeltaState as AdadeltaState,
    ScaleByAdadelta as ScaleByAdadelta,
)
from ._optimizers.adafactor import (
    Adafactor as Adafactor,
    AdafactorState as AdafactorState,
    ScaleByFactoredRms as ScaleByFactoredRms,
)
from ._optimizers.adagrad import (
    Adagrad as Adagrad,
    AdagradState as AdagradState,
    ScaleByRss as ScaleByRss,
)
from ._optimizers.adam import (
    Adam as Adam,
    AdamState as AdamState,
    AdamW as AdamW,
    ScaleByAdam as ScaleByAdam,
)
from ._optimizers.adam_family import (
    AdaBelief as AdaBelief,
    Adamax as Adamax,
    AdamaxW as AdamaxW,
    AMSGrad as AMSGrad,
    AMSGradState as AMSGradState,
    NAdam as NAdam,
    NAdamW as NAdamW,
    RAdam as RAdam,
    ScaleByAdamax as ScaleByAdamax,
    ScaleByAmsgrad as ScaleByAmsgrad,
    ScaleByBelief as ScaleByBelief,
    ScaleByRadam as ScaleByRadam,
    ScaleByYogi as ScaleByYogi,
    Yogi as Yogi,
)
from ._optimizers.adan import (
    AdaN as AdaN,
    AdaNState as AdaNState,
    ScaleByAdaN as ScaleByAdaN,
)
from ._optimizers.ademamix import AdEMAMix as AdEMAMix, AdEMAMixState as AdEMAMixState
from ._optimizers.adopt import ADOPT as ADOPT, ADOPTState as ADOPTState
from ._optimizers.cocob import COCOB as COCOB, COCOBState as COCOBState
from ._optimizers.dadapt import (
    DAdaptAdamW as DAdaptAdamW,
    DAdaptAdamWState as DAdaptAdamWState,
)
from ._optimizers.dog import (
    DoG as DoG,
    DoGState as DoGState,
    DoWG as DoWG,
    DoWGState as DoWGState,
)
from ._optimizers.dpsgd import (
    DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
    DPSGD as DPSGD,
    DPSGDState as DPSGDState,
)
from ._optimizers.fromage import Fromage as Fromage
from ._optimizers.galore import (
    GaLore as GaLore,
    GaLoreDimensionNumbers as GaLoreDimensionNumbers,
    GaLoreState as GaLoreState,
    ScaleByGaLore as ScaleByGaLore,
)
from ._optimizers.kron import (
    Kron as Kron,
    KronState as KronState,
    PrecondUpdateProbSchedule as PrecondUpdateProbSchedule,
)
from ._optimizers.lamb import (
    Lamb as Lamb,
    Lars as Lars,
    LarsState as LarsState,
    ScaleByTrustRatio as ScaleByTrustRatio,
)
from ._optimizers.lion import (
    Lion as Lion,
    LionState as LionState,
    ScaleByLion as ScaleByLion,
)
from ._optimizers.madgrad import Madgrad as Madgrad, MadgradState as MadgradState
from ._optimizers.mars import MARS as MARS, MARSState as MARSState
from ._optimizers.mechanize import (
    Mechanize as Mechanize,
    MechanizeState as MechanizeState,
)
from ._optimizers.momo import (
    Momo as Momo,
    MomoAdam as MomoAdam,
    MomoAdamState as MomoAdamState,
    MomoState as MomoState,
)
from ._optimizers.muon import (
    Muon as Muon,
    MuonDimensionNumbers as MuonDimensionNumbers,
    MuonState as MuonState,
    NorMuon as NorMuon,
    NorMuonState as NorMuonState,
    POLAR_EXPRESS_COEFFS as POLAR_EXPRESS_COEFFS,
)
from ._optimizers.noisy import (
    AddNoise as AddNoise,
    AddNoiseState as AddNoiseState,
    NoisySGD as NoisySGD,
)
from ._optimizers.normalize import Normalize as Normalize
from ._optimizers.novograd import (
    Novograd as Novograd,
    NovogradState as NovogradState,
    ScaleByNovograd as ScaleByNovograd,
)
from ._optimizers.optimistic import (
    OptimisticAdam as OptimisticAdam,
    OptimisticAdamState as OptimisticAdamState,
    OptimisticGradientDescent as OptimisticGradientDescent,
    OptimisticGradientState as OptimisticGradientState,
    ScaleByOptimisticGradient as ScaleByOptimisticGradient,
)
from ._optimizers.polyak import PolyakSGD as PolyakSGD, ScaleByPolyak as ScaleByPolyak
from ._optimizers.prodigy import Prodigy as Prodigy, ProdigyState as ProdigyState
from ._optimizers.rmsprop import (
    RMSProp as RMSProp,
    RMSPropState as RMSPropState,
    ScaleByRms as ScaleByRms,
    ScaleByStddev as ScaleByStddev,
)
from ._optimizers.rprop import Rprop as Rprop, RpropState as RpropState
from ._optimizers.sam import SAM as SAM, SAMState as SAMState
from ._optimizers.schedule_free import (
    ScheduleFree as ScheduleFree,
    ScheduleFreeAdamW as ScheduleFreeAdamW,
    ScheduleFreeAdamWState as ScheduleFreeAdamWState,
    ScheduleFreeSGD as ScheduleFreeSGD,
    ScheduleFreeSGDState as ScheduleFreeSGDState,
    ScheduleFreeState as ScheduleFreeState,
)
from ._optimizers.sgd import SGD as SGD, SGDState as SGDState
from ._optimizers.shampoo import Shampoo as Shampoo, ShampooState as ShampooState
from ._optimizers.sign import (
    ScaleBySign as ScaleBySign,
    SignSGD as SignSGD,
    Signum as Signum,
    SignumState as SignumState,
)
from ._optimizers.simplified_ademamix import (
    SimplifiedAdEMAMix as SimplifiedAdEMAMix,
    SimplifiedAdEMAMixState as SimplifiedAdEMAMixState,
)
from ._optimizers.sm3 import ScaleBySM3 as ScaleBySM3, SM3 as SM3, SM3State as SM3State
from ._optimizers.soap import SOAP as SOAP, SOAPState as SOAPState
from ._optimizers.sophia import (
    HutchinsonEstimatorDiagHessian as HutchinsonEstimatorDiagHessian,
    HutchinsonState as HutchinsonState,
    Sophia as Sophia,
    SophiaState as SophiaState,
)
from ._sharding import (
    abstract_state as abstract_state,
    state_shardings as state_shardings,
)
from ._solution import RESULTS as RESULTS, Solution as Solution
from ._solver.lbfgs import LBFGS as LBFGS, LBFGSState as LBFGSState
from ._solver.lbfgsb import LBFGSB as LBFGSB, LBFGSBState as LBFGSBState
from ._transform.accumulate import (
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
)
from ._transform.agc import AdaptiveGradClip as AdaptiveGradClip
from ._transform.cautious import Cautious as Cautious
from ._transform.centralize import Centralize as Centralize
from ._transform.chain import Chain as Chain
from ._transform.clip import Clip as Clip, ClipByGlobalNorm as ClipByGlobalNorm
from ._transform.complex import (
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
)
from ._transform.ema import (
    EMA as EMA,
    EMAState as EMAState,
    ParamsEMA as ParamsEMA,
    ParamsEMAState as ParamsEMAState,
)
from ._transform.lookahead import (
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
)
from ._transform.mask import (
    Masked as Masked,
    MaskedState as MaskedState,
    Partition as Partition,
    PartitionState as PartitionState,
)
from ._transform.misc import (
    ClipByBlockRms as ClipByBlockRms,
    NormalizeByUpdateNorm as NormalizeByUpdateNorm,
    ScaleByParamBlockNorm as ScaleByParamBlockNorm,
    ScaleByParamBlockRms as ScaleByParamBlockRms,
)
from ._transform.nan import (
    ApplyIfFinite as ApplyIfFinite,
    ApplyIfFiniteState as ApplyIfFiniteState,
    ZeroNans as ZeroNans,
    ZeroNansState as ZeroNansState,
)
from ._transform.nonnegative import KeepParamsNonnegative as KeepParamsNonnegative
from ._transform.plateau import (
    ReduceOnPlateau as ReduceOnPlateau,
    ReduceOnPlateauState as ReduceOnPlateauState,
)
from ._transform.project import ProjectBox as ProjectBox
from ._transform.scale import Scale as Scale, ScaleByLearningRate as ScaleByLearningRate
from ._transform.trace import Trace as Trace, TraceState as TraceState
from ._transform.weight_decay import AddDecayedWeights as AddDecayedWeights
from ._verify import (
    StateLeaf as StateLeaf,
    StateReport as StateReport,
    verify as verify,
)


try:
    __version__ = _metadata.version("eqxopt")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"

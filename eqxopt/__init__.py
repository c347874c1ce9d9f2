"""eqxopt: Equinox-native optimizers for JAX, with typed state that never drifts."""

import importlib.metadata as _metadata

from . import schedules as schedules
from ._adam.acprop import AcProp as AcProp, AcPropState as AcPropState
from ._adam.adabelief import AdaBelief as AdaBelief, ScaleByBelief as ScaleByBelief
from ._adam.adam import Adam as Adam, AdamW as AdamW, ScaleByAdam as ScaleByAdam
from ._adam.adamax import (
    Adamax as Adamax,
    AdamaxW as AdamaxW,
    ScaleByAdamax as ScaleByAdamax,
)
from ._adam.adan import AdaN as AdaN, AdaNState as AdaNState, ScaleByAdaN as ScaleByAdaN
from ._adam.ademamix import AdEMAMix as AdEMAMix, AdEMAMixState as AdEMAMixState
from ._adam.adopt import ADOPT as ADOPT, ADOPTState as ADOPTState
from ._adam.amsgrad import (
    AMSGrad as AMSGrad,
    AMSGradState as AMSGradState,
    ScaleByAmsgrad as ScaleByAmsgrad,
)
from ._adam.base import AdamState as AdamState
from ._adam.lamb import Lamb as Lamb
from ._adam.mars import MARS as MARS, MARSState as MARSState
from ._adam.nadam import NAdam as NAdam, NAdamW as NAdamW
from ._adam.novograd import (
    Novograd as Novograd,
    NovogradState as NovogradState,
    ScaleByNovograd as ScaleByNovograd,
)
from ._adam.radam import RAdam as RAdam, ScaleByRadam as ScaleByRadam
from ._adam.simplified_ademamix import (
    SimplifiedAdEMAMix as SimplifiedAdEMAMix,
    SimplifiedAdEMAMixState as SimplifiedAdEMAMixState,
)
from ._adam.yogi import ScaleByYogi as ScaleByYogi, Yogi as Yogi
from ._adaptive.adadelta import (
    Adadelta as Adadelta,
    AdadeltaState as AdadeltaState,
    ScaleByAdadelta as ScaleByAdadelta,
)
from ._adaptive.adafactor import (
    Adafactor as Adafactor,
    AdafactorState as AdafactorState,
    ScaleByFactoredRms as ScaleByFactoredRms,
)
from ._adaptive.adagrad import (
    Adagrad as Adagrad,
    AdagradState as AdagradState,
    ScaleByRss as ScaleByRss,
)
from ._adaptive.madgrad import Madgrad as Madgrad, MadgradState as MadgradState
from ._adaptive.rmsprop import (
    RMSProp as RMSProp,
    RMSPropState as RMSPropState,
    ScaleByRms as ScaleByRms,
    ScaleByStddev as ScaleByStddev,
)
from ._adaptive.sm3 import ScaleBySM3 as ScaleBySM3, SM3 as SM3, SM3State as SM3State
from ._adaptive.sophia import (
    HutchinsonEstimatorDiagHessian as HutchinsonEstimatorDiagHessian,
    HutchinsonState as HutchinsonState,
    Sophia as Sophia,
    SophiaState as SophiaState,
)
from ._checkpoint import (
    check_checkpoint as check_checkpoint,
    CheckpointMismatchError as CheckpointMismatchError,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._core.base import (
    AbstractOptimizer as AbstractOptimizer,
    child_update as child_update,
    CountState as CountState,
    EmptyState as EmptyState,
    StateDriftError as StateDriftError,
)
from ._core.verify import (
    StateLeaf as StateLeaf,
    StateReport as StateReport,
    verify as verify,
)
from ._interop import (
    from_optax as from_optax,
    FromOptax as FromOptax,
    FromOptaxState as FromOptaxState,
    to_optax as to_optax,
)
from ._least_squares.curve_fit import curve_fit as curve_fit
from ._least_squares.least_squares import least_squares as least_squares
from ._least_squares.lm import LevenbergMarquardt as LevenbergMarquardt
from ._least_squares.trf import TrustRegionReflective as TrustRegionReflective
from ._matrix.galore import (
    GaLore as GaLore,
    GaLoreDimensionNumbers as GaLoreDimensionNumbers,
    GaLoreState as GaLoreState,
    ScaleByGaLore as ScaleByGaLore,
)
from ._matrix.kron import (
    Kron as Kron,
    KronState as KronState,
    PrecondUpdateProbSchedule as PrecondUpdateProbSchedule,
)
from ._matrix.muon import (
    Muon as Muon,
    MuonDimensionNumbers as MuonDimensionNumbers,
    MuonState as MuonState,
    NorMuon as NorMuon,
    NorMuonState as NorMuonState,
    POLAR_EXPRESS_COEFFS as POLAR_EXPRESS_COEFFS,
)
from ._matrix.shampoo import Shampoo as Shampoo, ShampooState as ShampooState
from ._matrix.soap import SOAP as SOAP, SOAPState as SOAPState
from ._minimize.backtracking import (
    Backtracking as Backtracking,
    BacktrackingState as BacktrackingState,
)
from ._minimize.constrained import (
    AugmentedLagrangian as AugmentedLagrangian,
    Constraints as Constraints,
)
from ._minimize.lbfgs import LBFGS as LBFGS, LBFGSState as LBFGSState
from ._minimize.lbfgsb import LBFGSB as LBFGSB, LBFGSBState as LBFGSBState
from ._minimize.linesearch import (
    AbstractLineSearch as AbstractLineSearch,
    LineSearchResult as LineSearchResult,
)
from ._minimize.minimize import minimize as minimize
from ._minimize.newton_cg import NewtonCG as NewtonCG, NewtonCGState as NewtonCGState
from ._minimize.solution import RESULTS as RESULTS, Solution as Solution
from ._minimize.zoom import Zoom as Zoom, ZoomState as ZoomState
from ._parameter_free.cocob import COCOB as COCOB, COCOBState as COCOBState
from ._parameter_free.dadapt import (
    DAdaptAdamW as DAdaptAdamW,
    DAdaptAdamWState as DAdaptAdamWState,
)
from ._parameter_free.dog import (
    DoG as DoG,
    DoGState as DoGState,
    DoWG as DoWG,
    DoWGState as DoWGState,
)
from ._parameter_free.mechanize import (
    Mechanize as Mechanize,
    MechanizeState as MechanizeState,
)
from ._parameter_free.momo import (
    Momo as Momo,
    MomoAdam as MomoAdam,
    MomoAdamState as MomoAdamState,
    MomoState as MomoState,
)
from ._parameter_free.polyak import (
    PolyakSGD as PolyakSGD,
    ScaleByPolyak as ScaleByPolyak,
)
from ._parameter_free.prodigy import Prodigy as Prodigy, ProdigyState as ProdigyState
from ._quantized import (
    Quantized as Quantized,
    QuantizedArray as QuantizedArray,
)
from ._sgd.dpsgd import (
    DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
    DPSGD as DPSGD,
    DPSGDState as DPSGDState,
)
from ._sgd.fromage import Fromage as Fromage
from ._sgd.lars import Lars as Lars, LarsState as LarsState
from ._sgd.lion import Lion as Lion, LionState as LionState, ScaleByLion as ScaleByLion
from ._sgd.noisy_sgd import (
    AddNoise as AddNoise,
    AddNoiseState as AddNoiseState,
    NoisySGD as NoisySGD,
)
from ._sgd.optimistic import (
    OptimisticAdam as OptimisticAdam,
    OptimisticAdamState as OptimisticAdamState,
    OptimisticGradientDescent as OptimisticGradientDescent,
    OptimisticGradientState as OptimisticGradientState,
    ScaleByOptimisticGradient as ScaleByOptimisticGradient,
)
from ._sgd.rprop import Rprop as Rprop, RpropState as RpropState
from ._sgd.sgd import SGD as SGD, SGDState as SGDState
from ._sgd.sign import (
    ScaleBySign as ScaleBySign,
    SignSGD as SignSGD,
    Signum as Signum,
    SignumState as SignumState,
)
from ._sharding import (
    abstract_state as abstract_state,
    state_shardings as state_shardings,
)
from ._transforms.adaptive_grad_clip import AdaptiveGradClip as AdaptiveGradClip
from ._transforms.centralize import Centralize as Centralize
from ._transforms.clip import (
    Clip as Clip,
    ClipByBlockRms as ClipByBlockRms,
    ClipByGlobalNorm as ClipByGlobalNorm,
)
from ._transforms.nonnegative import KeepParamsNonnegative as KeepParamsNonnegative
from ._transforms.normalize import (
    Normalize as Normalize,
    NormalizeByUpdateNorm as NormalizeByUpdateNorm,
)
from ._transforms.param_block import (
    ScaleByParamBlockNorm as ScaleByParamBlockNorm,
    ScaleByParamBlockRms as ScaleByParamBlockRms,
)
from ._transforms.project import ProjectBox as ProjectBox
from ._transforms.reduce_on_plateau import (
    ReduceOnPlateau as ReduceOnPlateau,
    ReduceOnPlateauState as ReduceOnPlateauState,
)
from ._transforms.scale import (
    Scale as Scale,
    ScaleByLearningRate as ScaleByLearningRate,
)
from ._transforms.trace import Trace as Trace, TraceState as TraceState
from ._transforms.trust_ratio import ScaleByTrustRatio as ScaleByTrustRatio
from ._transforms.weight_decay import AddDecayedWeights as AddDecayedWeights
from ._transforms.zero_nans import ZeroNans as ZeroNans, ZeroNansState as ZeroNansState
from ._wrappers.apply_if_finite import (
    ApplyIfFinite as ApplyIfFinite,
    ApplyIfFiniteState as ApplyIfFiniteState,
)
from ._wrappers.cautious import Cautious as Cautious
from ._wrappers.chain import Chain as Chain
from ._wrappers.ema import (
    EMA as EMA,
    EMAState as EMAState,
    ParamsEMA as ParamsEMA,
    ParamsEMAState as ParamsEMAState,
)
from ._wrappers.lookahead import (
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
)
from ._wrappers.masked import Masked as Masked, MaskedState as MaskedState
from ._wrappers.multi_steps import (
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
)
from ._wrappers.partition import (
    Partition as Partition,
    PartitionState as PartitionState,
)
from ._wrappers.precision import (
    Compensated as Compensated,
    CompensatedState as CompensatedState,
    StochasticRounding as StochasticRounding,
    StochasticRoundingState as StochasticRoundingState,
)
from ._wrappers.sam import SAM as SAM, SAMState as SAMState
from ._wrappers.schedule_free import (
    ScheduleFree as ScheduleFree,
    ScheduleFreeAdamW as ScheduleFreeAdamW,
    ScheduleFreeAdamWState as ScheduleFreeAdamWState,
    ScheduleFreeSGD as ScheduleFreeSGD,
    ScheduleFreeSGDState as ScheduleFreeSGDState,
    ScheduleFreeState as ScheduleFreeState,
)
from ._wrappers.split_real_and_imaginary import (
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
)


try:
    __version__ = _metadata.version("eqxopt")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"

import { LabIcon } from '@jupyterlab/ui-components';

import computeSvgStr from '../style/icons/compute.svg';
import pipelineSvgStr from '../style/icons/pipeline.svg';

/**
 * The icon of the Compute panel in the left sidebar.
 */
export const computeIcon = new LabIcon({
  name: 'jupyter-remote-compute:compute',
  svgstr: computeSvgStr
});

/**
 * The icon of a pipeline document (`*.rcpipeline`).
 */
export const pipelineIcon = new LabIcon({
  name: 'jupyter-remote-compute:pipeline',
  svgstr: pipelineSvgStr
});
